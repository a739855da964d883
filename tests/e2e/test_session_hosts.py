"""Sandbox sessions across hosts: two real rollout workers (`celery worker -P threads`), each with a sandbox pool
of its own. A trajectory's session opens on whichever worker takes the request; its later calls reach that worker
through its own sessions queue and find the same workspace. When that worker is killed mid-session, the next call
ends as an infrastructure error within seconds (its host no longer answers Celery's ping), its sandboxes die with
it, and the trajectory's retry opens a fresh session on the other worker."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from apps.common import wiring
from tests.support.processes import wait_for
from workers.remote import RemoteToolRunner
from workers.rl.rollout.sessions import TrajectoryTools
from workers.rl.rollout.tools import RUN_PYTHON_TOOL
from workers.rl.types import TaskTemplate
from workers.sandbox import SandboxImage
from workers.sandbox.soak import uid_process_counts
from workers.verifiers import Item

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.redis, pytest.mark.processes, pytest.mark.sandbox]

IMAGE = SandboxImage(key="sandbox_image/session-hosts@1", layers=({"type": "base", "image": "python-3.11"},),
                     warm_pool_size=1)
TEMPLATE = TaskTemplate.from_spec(  # its verifier is never asked: the test is about the session's host
    key="task_template/notes@1", domain="notes", image=IMAGE, verifier_key="verifier/none@1",
    verifier_spec={"layers": [{"name": "exact", "kind": "exact", "checks": [{"type": "string_check"}]}]},
    spec={"prompt_template": "{q}", "sandbox_image": "session-hosts@1", "verifier": "none@1",
          "tools": [RUN_PYTHON_TOOL], "limits": {"max_turns": 30, "max_tokens": 4000, "max_seconds": 120},
          "session": {"idle_timeout": 60, "lifetime": 120, "max_calls": 50, "disk_mb": 32, "memory_mb": 128,
                      "call_seconds": 10}})
ITEM = Item(key="notes-1", inputs={"q": "keep notes"}, hidden={})
APPEND = "open('notes.txt', 'a').write('x'); print(len(open('notes.txt').read()))"


@pytest.fixture
def workers(tmp_path):
    """Two rollout workers on the test run's Redis: name -> process."""
    started = {}
    for name in ("east", "west"):
        env = {**os.environ, "STUDIO_DATA_DIR": str(tmp_path / name)}
        env.pop("DATABASE_URL", None)  # session tasks touch no database
        log = (tmp_path / f"{name}.log").open("w")
        started[f"{name}@session-test"] = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "studio", "worker", "-Q", "rollout", "-P", "threads", "-c", "4",
             "-n", f"{name}@session-test", "--without-gossip", "--without-mingle", "-l", "INFO"],
            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    app = wiring.celery_app()
    try:
        wait_for(lambda: len(app.control.ping(timeout=0.5)) >= 2, seconds=60, what="both workers to answer",
                 logs=tmp_path)
        yield app, started
    finally:
        for process in started.values():
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=15)


def test_a_session_stays_on_its_host_and_a_lost_host_ends_it_as_an_infrastructure_error(workers, tmp_path):
    app, processes = workers
    runner = RemoteToolRunner(app, max_output_chars=2000, timeout=60, session_open_timeout=60)
    tools = TrajectoryTools(runner, TEMPLATE, ITEM)
    counts = [tools.run("run_python", {"code": APPEND}).stdout.strip() for _ in range(3)]
    assert counts == ["1", "2", "3"]  # every call reached the host that holds the workspace
    host = tools.session.host
    assert host in processes and tools.session.queue == f"sessions.{host}"

    killed = processes[host]
    os.killpg(killed.pid, signal.SIGKILL)
    killed.wait(timeout=10)
    started = time.monotonic()
    lost = tools.run("run_python", {"code": APPEND})
    assert lost.status == "infra_error" and host in lost.reason and "gone" in lost.reason
    assert time.monotonic() - started < 10  # told by the host check, not by the call's own time running out
    tools.close()

    uids = range(200_000 + (killed.pid % 1000) * 1000, 200_000 + (killed.pid % 1000) * 1000 + 1000)
    wait_for(lambda: not uid_process_counts(uids), seconds=10, what="the lost host's sandboxes to die",
             logs=tmp_path)

    retry = TrajectoryTools(runner, TEMPLATE, ITEM)  # the trajectory starts over: a fresh session elsewhere
    try:
        assert retry.run("run_python", {"code": APPEND}).stdout.strip() == "1"
        assert retry.session.host != host
    finally:
        retry.close()

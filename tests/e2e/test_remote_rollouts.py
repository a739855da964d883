"""Tool calls and verifications on the `rollout` and `verify` queues: a real Celery worker serves them, and the
engine's remote runners (workers/remote.py) send them by task name, as a run's attempt does on services. What
crosses the queue is JSON (artifacts as base64); what comes back is the same ToolResult and Verdict the
in-process runners give."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from apps.common import wiring
from tests.support.processes import wait_for
from tests.support.servers import free_port
from workers.remote import RemoteToolRunner, RemoteVerifier
from workers.rl.rollout.grading import LocalVerifier
from workers.rl.rollout.tools import RUN_PYTHON_TOOL
from workers.rl.types import TaskTemplate, Trajectory, Turn
from workers.sandbox import SandboxImage
from workers.verifiers import Item

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.redis, pytest.mark.processes]

NUMERIC = {"layers": [{"name": "number", "kind": "exact", "checks": [
    {"type": "numeric", "name": "answer", "reference": "{answer}", "abs_tolerance": 0, "rel_tolerance": 0}]}]}
IMAGE = SandboxImage(key="sandbox_image/plain-python@1", layers=({"type": "base", "image": "python-3.11"},),
                     warm_pool_size=1)
TEMPLATE = TaskTemplate.from_spec(
    key="task_template/add@1", domain="arithmetic", image=IMAGE, verifier_key="verifier/numeric@1",
    verifier_spec=NUMERIC, spec={"prompt_template": "{a}+{b}=", "sandbox_image": "plain-python@1",
                                 "verifier": "numeric@1", "tools": [RUN_PYTHON_TOOL],
                                 "limits": {"max_turns": 2, "max_tokens": 16, "max_seconds": 30}})


@pytest.fixture
def redis_app():
    """The studio's Celery app, on the test run's Redis."""
    return wiring.celery_app()


@pytest.fixture(scope="module")
def worker(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("remote-worker")
    metrics_port = free_port()
    env = {**os.environ, "STUDIO_DATA_DIR": str(tmp_path / "data"), "STUDIO_METRICS_PORT": str(metrics_port),
           "STUDIO_METRICS_ADDR": "127.0.0.1"}
    env.pop("DATABASE_URL", None)  # the rollout and verify tasks touch no database
    log = (tmp_path / "worker.log").open("w")
    process = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "studio", "worker", "-Q", "rollout,verify", "-P", "threads", "-c", "2",
         "-n", "remote@%h", "--without-gossip", "--without-mingle", "-l", "INFO"],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    app = wiring.celery_app()
    try:
        wait_for(lambda: app.control.ping(timeout=0.5), seconds=60, what="the worker to answer", logs=tmp_path)
        app.metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
        yield app
    finally:
        os.killpg(process.pid, signal.SIGTERM)  # a warm shutdown; past 15 s, no more waiting
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=15)


def test_with_no_verify_worker_a_verification_is_ungraded_and_names_the_queue(redis_app):
    """Before any worker serves the queue: the run would otherwise wait without end and say nothing."""
    item = Item(key="add-2-3", inputs={"a": 2, "b": 3}, hidden={"answer": 5})
    verdict = RemoteVerifier(redis_app, timeout=1).verify(TEMPLATE, _answered("5"), item)
    assert verdict.reward is None and verdict.status == "infra_error"
    assert "'verify' queue" in verdict.stopped_because
    assert "celery -A studio worker -Q verify" in verdict.stopped_because


def _answered(text: str) -> Trajectory:
    return Trajectory(id="00000000-0000-4000-8000-0000000000aa", run_id="00000000-0000-4000-8000-000000000001",
                      seq=0, sample=0, domain="arithmetic", template=TEMPLATE.key, task_key="add-2-3", task_hash="",
                      image=IMAGE.key, verifier=TEMPLATE.verifier_key, policy_version=0,
                      turns=[Turn(role="user", content="2+3="), Turn(role="assistant", content=text)])


def test_a_remote_verification_gives_the_local_verdict(worker):
    item = Item(key="add-2-3", inputs={"a": 2, "b": 3}, hidden={"answer": 5})
    remote = RemoteVerifier(worker, timeout=60)
    for answer, reward in (("5", 1.0), ("6", 0.0)):
        verdict = remote.verify(TEMPLATE, _answered(answer), item)
        local = LocalVerifier(pool=None).verify(TEMPLATE, _answered(answer), item)
        assert verdict.reward == reward == local.reward
        assert [(c.layer, c.name, c.value, c.status) for c in verdict.components] == \
               [(c.layer, c.name, c.value, c.status) for c in local.components]


def test_the_worker_serves_its_metrics(worker):
    """The verify worker's own /metrics (STUDIO_METRICS_PORT): the verdicts it gave, per deciding layer, and the
    time its tasks took."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    item = Item(key="add-2-3", inputs={"a": 2, "b": 3}, hidden={"answer": 5})
    RemoteVerifier(worker, timeout=60).verify(TEMPLATE, _answered("5"), item)
    text = urllib.request.urlopen(worker.metrics_url, timeout=10).read().decode()
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families(text) for s in family.samples}
    assert samples[("studio_verdicts_total", (("deciding_layer_kind", "exact"), ("status", "pass")))] >= 1
    assert samples[("studio_celery_task_duration_seconds_count",
                    (("state", "SUCCESS"), ("task", "workers.tasks.verify_trajectory")))] >= 1


@pytest.mark.sandbox
def test_a_remote_tool_call_runs_in_the_workers_sandbox(worker):
    runner = RemoteToolRunner(worker, max_output_chars=2000, timeout=120)
    result = runner.run(IMAGE, "run_python", {"code": "import sys; print(6 * 7); print('warn', file=sys.stderr)"})
    assert result.status == "ok" and result.exit_code == 0
    assert result.stdout.strip() == "42" and "warn" in result.stderr and "42" in result.text

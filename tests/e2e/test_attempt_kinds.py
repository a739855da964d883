"""Every kind of run stops and resumes alike (apps/runs/attempts/base.py: one failure policy). An evaluation and a
reference check whose Celery worker is killed mid-run are taken over by another worker (the evaluation goes on
after the last batch it archived, the reference check is checked again from its start), and a database that goes
away while the second worker runs them is waited out. Each ends completed on its second attempt with every answer
archived exactly once. Training does the same in test_worker_killed.py and test_faults.py.

A private PostgreSQL for each test (tests/support/servers.py), so that it can be stopped; real `celery worker`
processes on the gpu queue, the second with the watchdog (beat)."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest

from tests.support import ROOT
from tests.support.processes import wait_for
from tests.support.servers import private_postgres

pytestmark = [pytest.mark.servers, pytest.mark.processes, pytest.mark.redis, pytest.mark.sandbox]

TASKS, SAMPLES, BATCH = 128, 2, 16  # the evaluation: 8 batches (workers/rl/rollout/evaluation.py BATCH_TASKS)
REFERENCES = 8  # the reference check: each reference sleeps a second in the sandbox, verified one at a time
SEED = f"""
import os, sys, django
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "studio.settings")
django.setup()
from django.core.management import call_command
call_command("migrate", verbosity=0)
from django.contrib.auth import get_user_model
from apps.accounts.services import project_create
from apps.demo.verifiers import PYTHON_UNIT_TESTS
from apps.evals.services import evaluation_launch
from apps.registry.services import version_publish
from apps.runs.models import RunKind
from apps.runs.services import run_create
from tests.support.specimens import DOMAIN_SPEC, IMAGE_SPEC, TEMPLATE_SPEC, VERIFIER_SPEC, addition_instances

owner = get_user_model().objects.create_user("olive", password="pw-for-tests")
project = project_create(team_slug="acme", slug="acme-rl", name="Acme RL", owner=owner)
def publish(kind, slug, spec, **extra):
    return version_publish(project=project, kind=kind, slug=slug, spec=spec, author=owner, **extra).version
publish("sandbox_image", "py-basic", IMAGE_SPEC)
if sys.argv[1] == "evaluation":
    publish("verifier", "numeric", VERIFIER_SPEC)
    publish("task_template", "add-two", TEMPLATE_SPEC, instances=addition_instances({TASKS}))
    publish("domain", "arithmetic", DOMAIN_SPEC)
    suite = publish("bundle", "arith-suite", {{"members": ["domain/arithmetic@latest"],
        "run_config": {{"rollout_concurrency": 1}},  # one answer at a time: batches the kill can fall between
        "evaluation": {{"tasks_per_template": {TASKS}, "samples_per_task": {SAMPLES}, "temperature": 1.0}}}})
    model = publish("model", "demo-tiny", {{"source": {{"type": "builtin", "name": "demo-tiny"}}}})
    run = evaluation_launch(project=project, suite=suite, actor=None, model=model, via="cli").run
else:
    publish("verifier", "unit-tests", PYTHON_UNIT_TESTS)
    slow = [{{"key": f"slow-{{i}}", "inputs": {{"i": i}}, "hidden": {{
        "canonical_solution": f"import time\\ntime.sleep(1)\\n\\ndef f():\\n    return {{i}}\\n",
        "tests": f"import unittest\\nfrom solution import f\\n\\nclass T(unittest.TestCase):\\n"
                 f"    def test_f(self):\\n        self.assertEqual(f(), {{i}})\\n"}}}} for i in range({REFERENCES})]
    publish("task_template", "slow-code", {{"prompt_template": "Write f() returning {{i}}.",
        "sandbox_image": "py-basic", "verifier": "unit-tests",
        "limits": {{"max_turns": 1, "max_tokens": 64, "max_seconds": 60}}}}, instances=slow)
    publish("domain", "coding", {{"templates": [{{"template": "slow-code", "weight": 1.0}}]}})
    bundle = publish("bundle", "code-bundle", {{"members": ["domain/coding@latest"]}})
    run = run_create(project=project, bundle=bundle, steps=1, kind=RunKind.REFERENCE, enqueue=True,
                     overrides={{"reference_per_template": {REFERENCES}, "verify_concurrency": 1}})
print(run.pk)
"""


def _worker(tmp_path: Path, name: str, env: dict, *, beat: bool) -> subprocess.Popen:
    command = [sys.executable, "-m", "celery", "-A", "studio", "worker", "-Q", "gpu", "-P", "solo", "-c", "1",
               "-n", f"{name}@%h", "--without-gossip", "--without-mingle", "-l", "INFO"] + (["-B"] if beat else [])
    log = (tmp_path / f"{name}.log").open("w")
    return subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def _stop(process: subprocess.Popen | None) -> None:
    if process is not None and process.poll() is None:
        os.killpg(process.pid, signal.SIGKILL)
    if process is not None:
        process.wait(timeout=30)


@pytest.mark.parametrize("kind", ["evaluation", "reference"])
def test_a_killed_worker_and_a_database_outage_leave_the_run_to_be_resumed(kind, tmp_path):
    with private_postgres() as database:
        # Stale after 8 s: longer than the outage below, so only the kill makes the watchdog take the run over.
        env = {**os.environ, "DATABASE_URL": database.url, "STUDIO_DATA_DIR": str(tmp_path / "data"),
               "STUDIO_DEMO_PRETRAIN_SECONDS": "3", "STUDIO_REMOTE_ROLLOUTS": "0", "STUDIO_RUN_STALE_SECONDS": "8",
               "STUDIO_RUN_WATCHDOG_SECONDS": "1"}
        seeded = subprocess.run([sys.executable, "-c", SEED, kind], cwd=ROOT, env=env, capture_output=True,
                                text=True, timeout=300)
        assert seeded.returncode == 0, seeded.stderr[-3000:]
        run_id = seeded.stdout.split()[-1]

        def state():
            try:
                with psycopg.connect(database.url, connect_timeout=2) as connection:
                    return connection.execute("SELECT status, step, attempt, error FROM runs_run WHERE id = %s",
                                              (run_id,)).fetchone()
            except psycopg.OperationalError:
                return None

        first = _worker(tmp_path, "first", env, beat=False)
        second = None
        try:
            if kind == "evaluation":  # killed between batches, with some archived
                wait_for(lambda: (s := state()) and s[1] >= 2, seconds=240, what="batch 2", logs=tmp_path)
            else:  # killed in the middle of the references' verification
                wait_for(lambda: (s := state()) and s[0] == "running", seconds=240, what="the check to start",
                         logs=tmp_path)
                time.sleep(3)
            os.killpg(first.pid, signal.SIGKILL)
            first.wait(timeout=30)
            status, killed_at, _, _ = state()
            assert status == "running", "the run ended before its worker could be killed; make it longer"

            second = _worker(tmp_path, "second", env, beat=True)
            wait_for(lambda: (s := state()) and s[0] == "running" and s[2] == 2 and
                     (kind == "reference" or s[1] > killed_at), seconds=240, what="the second attempt's progress",
                     logs=tmp_path)
            if kind == "reference":
                time.sleep(3)  # into the verification, past reading the bundle (an outage there: a third attempt)
            database.stop()
            time.sleep(3)  # its heartbeats and writes fail meanwhile: waited out
            database.start()
            status, step, attempt, error = wait_for(
                lambda: (s := state()) and s[0] in ("completed", "failed") and s, seconds=300,
                what="the run to finish", logs=tmp_path)
        finally:
            _stop(first)
            _stop(second)
        with psycopg.connect(database.url) as connection:
            events = connection.execute("SELECT kind, attempt, message FROM runs_runevent WHERE run_id = %s "
                                        "ORDER BY id", (run_id,)).fetchall()
        assert (status, attempt) == ("completed", 2), (error, "\n".join(map(str, events)))
        with psycopg.connect(database.url) as connection:
            rows = connection.execute("SELECT seq, sample, step, attempt, reward FROM trajectories_trajectory "
                                      "WHERE run_id = %s", (run_id,)).fetchall()
            kinds = [k for (k,) in connection.execute("SELECT kind FROM runs_runevent WHERE run_id = %s",
                                                      (run_id,)).fetchall()]
    assert "worker_lost" in kinds and "failed" not in kinds
    assert "did not answer" in (tmp_path / "second.log").read_text()  # the outage was seen and waited out
    assert len(rows) == len({(seq, sample) for seq, sample, *_ in rows})  # nothing archived twice
    if kind == "evaluation":
        assert len(rows) == TASKS * SAMPLES and step == TASKS // BATCH
        # The batches the first attempt archived were not answered again.
        assert {attempt for _, _, step, attempt, _ in rows if step <= killed_at} == {1}
        assert {attempt for _, _, step, attempt, _ in rows if step > killed_at} == {2}
    else:
        assert len(rows) == REFERENCES and {reward for *_, reward in rows} == {1.0}
        assert {attempt for *_, attempt, _ in rows} == {2}  # checked again from the start

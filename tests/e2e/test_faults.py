"""Fault injection on the real services, while a run trains: its database restarts, its Redis restarts, its
checkpoint directory fills up. The run goes on (or resumes), loses no trajectory and writes none twice; a full
disk fails it clearly and leaves its last good checkpoint loadable.

The servers that are restarted are private to each test (tests/support/servers.py): the test suite's own
PostgreSQL and Redis are never touched. (A worker killed mid-run: test_worker_killed.py. A sandbox that stops
answering: tests/workers/sandbox/test_unanswering.py.)"""

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psycopg
import pytest
from celery import Celery

from apps.runs.attempts import run_attempt
from apps.runs.models import EventKind, MetricPoint, Run, RunStatus
from apps.runs.services import run_claim, run_create
from apps.trajectories.models import Trajectory
from tests.support import ROOT
from tests.support.processes import database_url, wait_for
from tests.support.servers import private_postgres, private_redis, small_filesystem
from workers.rl.models.policies import TinyLMPolicy
from workers.rl.training.checkpoint import checkpoints, latest_checkpoint, load_checkpoint

STEPS, GROUPS, GROUP_SIZE = 10, 4, 8
CONFIG = {"mode": "sync", "groups_per_step": GROUPS, "group_size": GROUP_SIZE, "dynamic_sampling": False,
          "checkpoint_every": 2, "eval_tasks_per_domain": 0}
# The studio's demo-like registry in a database of its own, and a run on it, queued for the gpu workers.
SEED = f"""
import os, django
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "studio.settings")
django.setup()
from django.core.management import call_command
call_command("migrate", verbosity=0)
from django.contrib.auth import get_user_model
from apps.accounts.services import project_create
from apps.registry.services import version_publish
from apps.runs.dispatch import run_enqueue
from apps.runs.services import run_create
from tests.support.specimens import DOMAIN_SPEC, IMAGE_SPEC, TEMPLATE_SPEC, VERIFIER_SPEC, addition_instances

owner = get_user_model().objects.create_user("olive", password="pw-for-tests")
project = project_create(team_slug="acme", slug="acme-rl", name="Acme RL", owner=owner)
def publish(kind, slug, spec, **extra):
    return version_publish(project=project, kind=kind, slug=slug, spec=spec, author=owner, **extra).version
publish("sandbox_image", "py-basic", IMAGE_SPEC)
publish("verifier", "numeric", VERIFIER_SPEC)
publish("task_template", "add-two", TEMPLATE_SPEC, instances=addition_instances())
publish("domain", "arithmetic", DOMAIN_SPEC)
bundle = publish("bundle", "arith-bundle", {{"members": ["domain/arithmetic@latest"]}})
run = run_create(project=project, bundle=bundle, steps={STEPS}, overrides={CONFIG!r})
run_enqueue(run)
print(run.pk)
"""


def _worker(tmp_path: Path, env: dict) -> subprocess.Popen:
    log = (tmp_path / "worker.log").open("w")
    command = [sys.executable, "-m", "celery", "-A", "studio", "worker", "-Q", "gpu", "-P", "solo", "-c", "1",
               "-n", "faults@%h", "--without-gossip", "--without-mingle", "-l", "INFO", "-B"]
    return subprocess.Popen(command, cwd=ROOT, env={**os.environ, "STUDIO_DATA_DIR": str(tmp_path / "data"),
                                                    "STUDIO_DEMO_PRETRAIN_SECONDS": "3",
                                                    "STUDIO_REMOTE_ROLLOUTS": "0",
                                                    "STUDIO_RUN_WATCHDOG_SECONDS": "2", **env},
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=30)


@pytest.mark.servers
@pytest.mark.processes
@pytest.mark.sandbox
@pytest.mark.redis  # its worker takes the gpu queue of the suite's Redis: no other test's worker may share it
def test_the_database_restarting_mid_run_loses_and_doubles_nothing(tmp_path):
    with private_postgres() as database:
        env = {"DATABASE_URL": database.url, "STUDIO_RUN_STALE_SECONDS": "30"}
        seeded = subprocess.run([sys.executable, "-c", SEED], cwd=ROOT, env={**os.environ, **env}, capture_output=True,
                                text=True, timeout=300)
        assert seeded.returncode == 0, seeded.stderr[-3000:]
        run_id = seeded.stdout.split()[-1]

        def state():
            try:
                with psycopg.connect(database.url, connect_timeout=2) as connection:
                    return connection.execute("SELECT step, status, error FROM runs_run WHERE id = %s",
                                              (run_id,)).fetchone()
            except psycopg.OperationalError:
                return None

        worker = _worker(tmp_path, env)
        try:
            wait_for(lambda: (s := state()) and s[0] >= 3, seconds=240, what="step 3", logs=tmp_path)
            database.stop()
            time.sleep(3)  # the worker's heartbeat and its next step's writes fail meanwhile
            database.start()
            step, status, error = wait_for(lambda: (s := state()) and s[1] in ("completed", "failed") and s,
                                           seconds=300, what="the run to finish", logs=tmp_path)
        finally:
            _stop(worker)
        assert (status, step) == ("completed", STEPS), error
        with psycopg.connect(database.url) as connection:
            rows = connection.execute("SELECT seq, sample FROM trajectories_trajectory WHERE run_id = %s",
                                      (run_id,)).fetchall()
            failed = connection.execute("SELECT count(*) FROM runs_runevent WHERE run_id = %s AND kind = 'failed'",
                                        (run_id,)).fetchone()[0]
            rewards = connection.execute("SELECT step FROM runs_metricpoint WHERE run_id = %s AND name = "
                                         "'reward/mean' ORDER BY step", (run_id,)).fetchall()
    assert len(rows) == STEPS * GROUPS * GROUP_SIZE == len(set(rows))
    assert failed == 0 and [s for (s,) in rewards] == list(range(1, STEPS + 1))
    assert "did not answer" in (tmp_path / "worker.log").read_text()  # the outage was seen and waited out


@pytest.mark.servers
@pytest.mark.processes
@pytest.mark.postgres
@pytest.mark.sandbox
@pytest.mark.django_db(transaction=True)
def test_redis_restarting_mid_run_loses_and_doubles_nothing(registry, project, tmp_path):
    run = run_create(project=project, bundle=registry["bundle"], steps=STEPS, overrides=CONFIG)
    with private_redis() as redis:
        worker = _worker(tmp_path, {"DATABASE_URL": database_url(), "REDIS_URL": redis.url,
                                    "STUDIO_RUN_STALE_SECONDS": "30"})
        try:
            Celery(broker=redis.url).send_task("workers.tasks.train_run", (str(run.pk),), queue="gpu")
            wait_for(lambda: Run.objects.get(pk=run.pk).step >= 3, seconds=240, what="step 3", logs=tmp_path)
            redis.kill()  # the broker, the results and the channel layer, all at once
            time.sleep(2)
            redis.start()
            finished = wait_for(lambda: Run.objects.filter(pk=run.pk, status__in=[RunStatus.COMPLETED,
                                                                                  RunStatus.FAILED]).first(),
                                seconds=300, what="the run to finish", logs=tmp_path)
        finally:
            _stop(worker)
    assert finished.status == RunStatus.COMPLETED and finished.step == STEPS, finished.error
    rows = list(Trajectory.objects.filter(run=run).values_list("seq", "sample"))
    assert len(rows) == STEPS * GROUPS * GROUP_SIZE == len(set(rows))
    assert not finished.events.filter(kind=EventKind.FAILED).exists()
    assert sorted(MetricPoint.objects.filter(run=run, name="reward/mean").values_list("step", flat=True)) == list(
        range(1, STEPS + 1))


@pytest.mark.servers
@pytest.mark.sandbox
@pytest.mark.django_db(transaction=True)
def test_a_full_checkpoint_disk_fails_the_run_clearly_and_keeps_its_last_checkpoint(registry, project, settings):
    with small_filesystem(64) as disk:
        settings.DATA_DIR, settings.DEMO_PRETRAIN_SECONDS, settings.REMOTE_ROLLOUTS = disk, 3, False
        run = run_create(project=project, bundle=registry["bundle"], steps=40,
                         overrides={**CONFIG, "checkpoint_every": 1, "keep_checkpoints": 2})
        attempt = run_claim(run_id=run.pk, stale_after=0)
        failure: list[BaseException] = []

        def train():
            try:
                run_attempt(run_id=run.pk, attempt=attempt)
            except BaseException as exc:  # the attempt marks the run failed and raises: expected here
                failure.append(exc)

        trainer = threading.Thread(target=train)
        trainer.start()
        directory = disk / "checkpoints" / str(run.pk)
        wait_for(lambda: len(checkpoints(directory)) >= 2, seconds=240, what="two checkpoints", logs=disk)
        with (disk / "filler").open("wb") as filler:  # the disk fills up under the run
            try:
                while True:
                    filler.write(b"\0" * (1 << 20))
                    filler.flush()
            except OSError:
                pass
        trainer.join(timeout=240)
        assert not trainer.is_alive()
        failed = Run.objects.get(pk=run.pk)
        assert failed.status == RunStatus.FAILED, failed.error
        assert failed.error.startswith("CheckpointError: could not write the checkpoint of step "), failed.error
        assert "No space left on device" in failed.error and str(directory) in failed.error.splitlines()[0]
        assert failure and "No space left on device" in str(failure[0])
        (disk / "filler").unlink()
        last = latest_checkpoint(directory)
        assert last is not None and last.step >= 1
        policy = TinyLMPolicy.load(next(p for p in (disk / "models").glob("demo-tiny-*") if p.is_dir()))
        trainer_state, pipeline_state = load_checkpoint(last, policy=policy)
        assert pipeline_state["step"] == last.step and trainer_state

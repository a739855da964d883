"""A Celery worker killed with SIGKILL mid-run: the watchdog queues the run again, another worker resumes it
from its last checkpoint, and every trajectory is archived exactly once.

Real PostgreSQL, real Redis, real `celery worker` processes; the test only starts, kills and watches them.
"""

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from apps.runs.dispatch import run_enqueue
from apps.runs.models import EventKind, MetricPoint, Run, RunStatus
from apps.runs.services import run_create
from apps.trajectories.models import Trajectory
from tests.support import ROOT
from tests.support.processes import database_url, wait_for

pytestmark = [pytest.mark.processes, pytest.mark.postgres, pytest.mark.redis, pytest.mark.django_db(transaction=True)]

STEPS, GROUPS, GROUP_SIZE = 12, 4, 8


def _worker(tmp_path: Path, name: str, *, beat: bool) -> subprocess.Popen:
    env = {**os.environ,
           "DATABASE_URL": database_url(),
           "STUDIO_DATA_DIR": str(tmp_path / "data"), "STUDIO_DEMO_PRETRAIN_SECONDS": "3",
           "STUDIO_RUN_STALE_SECONDS": "3", "STUDIO_RUN_WATCHDOG_SECONDS": "1", "STUDIO_REMOTE_ROLLOUTS": "0"}
    command = [sys.executable, "-m", "celery", "-A", "studio", "worker", "-Q", "gpu", "-P", "solo", "-c", "1",
               "-n", f"{name}@%h", "--without-gossip", "--without-mingle", "-l", "INFO"] + (["-B"] if beat else [])
    log = (tmp_path / f"{name}.log").open("w")
    return subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=30)


def test_a_worker_killed_mid_run_resumes_from_its_checkpoint_and_loses_or_doubles_nothing(registry, project,
                                                                                           tmp_path):
    run = run_create(project=project, bundle=registry["bundle"], steps=STEPS, overrides={
        "mode": "sync", "groups_per_step": GROUPS, "group_size": GROUP_SIZE, "dynamic_sampling": False,
        "checkpoint_every": 2, "eval_tasks_per_domain": 0})
    first = _worker(tmp_path, "first", beat=False)
    second = None
    try:
        run_enqueue(run)
        # Past a checkpoint (every 2 steps) and well before the end: kill the worker in the middle of a step.
        wait_for(lambda: Run.objects.get(pk=run.pk).step >= 3, seconds=240, what="step 3", logs=tmp_path)
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(timeout=30)
        killed_at = Run.objects.get(pk=run.pk).step
        assert killed_at < STEPS, "the run ended before the worker could be killed; make its steps longer"

        second = _worker(tmp_path, "second", beat=True)  # its beat runs the watchdog
        finished = wait_for(lambda: Run.objects.filter(pk=run.pk, status__in=[RunStatus.COMPLETED, RunStatus.FAILED])
                         .first(), seconds=300, what="the run to finish", logs=tmp_path)
    finally:
        _stop(first)
        if second is not None:
            _stop(second)

    assert finished.status == RunStatus.COMPLETED, finished.error
    assert finished.step == STEPS and finished.attempt == 2
    kinds = list(finished.events.values_list("kind", flat=True))
    assert EventKind.WORKER_LOST in kinds and EventKind.RESUMED in kinds
    resumed = finished.events.get(kind=EventKind.RESUMED)
    assert resumed.step <= killed_at and resumed.step % 2 == 0  # the last checkpoint before the kill

    # Nothing lost: every draw of every step, with its whole group. Nothing doubled: one row per (draw, sample).
    rows = list(Trajectory.objects.filter(run=run).values_list("seq", "sample", "step"))
    assert len(rows) == STEPS * GROUPS * GROUP_SIZE == len(set((seq, sample) for seq, sample, _ in rows))
    assert sorted({seq for seq, _, _ in rows}) == list(range(STEPS * GROUPS))
    per_step = {}
    for _, _, step in rows:
        per_step[step] = per_step.get(step, 0) + 1
    assert per_step == {step: GROUPS * GROUP_SIZE for step in range(1, STEPS + 1)}
    assert sorted(MetricPoint.objects.filter(run=run, name="reward/mean").values_list("step", flat=True)) == list(
        range(1, STEPS + 1))

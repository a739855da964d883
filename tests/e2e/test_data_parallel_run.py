"""A run whose config asks for `data_parallel: 2` trains on two processes wherever it is trained: the attempt the
worker claimed starts torchrun (apps/runs/ranks.py), rank 0 trains it — the database, the archive and
the checkpoints — and rank 1 takes part in every update and samples rollouts; the worker gets the summary from
the file rank 0 wrote. An attempt rank 0 leaves to be resumed is left to be resumed by the worker too, not failed."""

import os

import pytest

from apps.runs.attempts import Unfinished, run_attempt
from apps.runs.models import Run, RunStatus
from apps.runs.services import run_claim, run_create
from apps.trajectories.models import Trajectory
from tests.support.processes import database_url

pytestmark = [pytest.mark.processes, pytest.mark.postgres, pytest.mark.sandbox,
              pytest.mark.django_db(transaction=True)]

STEPS, GROUPS, GROUP_SIZE = 3, 2, 4


def test_a_run_asking_for_two_processes_trains_on_two_ranks(project, registry, owner, settings, monkeypatch):
    # What the worker's processes inherit: its database, data directory and settings.
    monkeypatch.setenv("DATABASE_URL", database_url())
    monkeypatch.setenv("STUDIO_DEMO_PRETRAIN_SECONDS", "3")
    monkeypatch.setenv("STUDIO_REMOTE_ROLLOUTS", "0")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("DEBUG", os.environ.get("DEBUG", "1"))
    run = run_create(project=project, bundle=registry["bundle"], steps=STEPS, name="two-ranks", actor=owner,
                     overrides={"data_parallel": 2, "groups_per_step": GROUPS, "group_size": GROUP_SIZE,
                                "dynamic_sampling": False, "eval_tasks_per_domain": 0, "checkpoint_every": 1})
    # The first attempt may go no time without progress: its heartbeat stalls at its first beat, and rank 0 abandons
    # the attempt within its first step, leaving the run to be resumed (as when the database or the object store
    # stays away).
    monkeypatch.setenv("STUDIO_RUN_STUCK_SECONDS", "0")
    abandoned = run_claim(run_id=run.pk, stale_after=0)
    assert run_attempt(run_id=run.pk, attempt=abandoned) == Unfinished.LEFT_TO_RESUME
    left = Run.objects.get(pk=run.pk)
    assert (left.status, left.attempt, left.error) == (RunStatus.RUNNING, abandoned, "")
    monkeypatch.delenv("STUDIO_RUN_STUCK_SECONDS")
    attempt = run_claim(run_id=run.pk, stale_after=0)

    summary = run_attempt(run_id=run.pk, attempt=attempt)

    assert (summary["outcome"], summary["steps"]) == ("completed", STEPS)
    assert summary["completions_by_rank"]["rank-0"] > 0 and summary["completions_by_rank"]["rank-1"] > 0
    run = Run.objects.get(pk=run.pk)
    assert (run.status, run.step, run.attempt) == (RunStatus.COMPLETED, STEPS, attempt)
    rows = list(Trajectory.objects.filter(run=run).values_list("seq", "sample"))
    assert len(rows) == len(set(rows)) >= STEPS * GROUPS * GROUP_SIZE
    assert sorted(run.checkpoints.values_list("step", flat=True))[-1] == STEPS
    log = (settings.DATA_DIR / "logs" / f"run-{run.pk}-attempt-{attempt}.log").read_text()
    assert f"rank 1: took part in {STEPS} updates" in log


def test_a_data_parallel_run_names_a_device_per_process():
    from workers.rl.config import ConfigError, GRPOConfig

    with pytest.raises(ConfigError, match="data-parallel run gives each process a device of its own"):
        GRPOConfig.resolve({"data_parallel": 2, "device": "cuda:1"})
    with pytest.raises(ConfigError, match="data_parallel"):
        GRPOConfig.resolve({"data_parallel": 0})

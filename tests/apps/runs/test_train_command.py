"""`manage.py train`'s arguments: a new run needs a bundle and steps, `--resume ID` trains an existing one here,
`--if-idle` (make demo) resumes the interrupted run rather than queueing another, and under torchrun (WORLD_SIZE > 1)
a run trains only headless — refused before any process group is joined. The 2-process training itself:
tests/workers/rl/training/test_distributed.py."""

import pytest
from django.core.management import CommandError, call_command

from apps.runs.models import Run, RunStatus
from apps.runs.services import run_claim, run_create, run_finish
from workers.rl.training import distributed


def test_a_new_run_needs_a_bundle_and_steps():
    with pytest.raises(CommandError, match="needs --steps and --bundle"):
        call_command("train", "--headless")
    with pytest.raises(CommandError, match="needs --steps and --bundle"):  # only sft and dpo may go without one
        call_command("train", "--steps", "1", "--dataset", "rows.jsonl")


@pytest.mark.django_db
def test_resume_trains_an_existing_run_here_only_headless():
    with pytest.raises(CommandError, match="add --headless"):
        call_command("train", "--resume", "00000000-0000-4000-8000-000000000000")
    with pytest.raises(CommandError, match="no run"):
        call_command("train", "--resume", "not-a-run", "--headless")


@pytest.mark.django_db
def test_if_idle_resumes_the_interrupted_training_run_and_says_so(project, registry, capsys):
    run = run_create(project=project, bundle=registry["bundle"], steps=10, name="demo")
    attempt = run_claim(run_id=run.pk, stale_after=0)
    run_finish(run_id=run.pk, attempt=attempt, status=RunStatus.INTERRUPTED)

    call_command("train", "--bundle", "arith-bundle", "--steps", "10", "--if-idle")

    assert list(Run.objects.values_list("name", "status")) == [("demo", RunStatus.QUEUED)]
    said = " ".join(capsys.readouterr().err.split())
    assert ("resuming run demo: interrupted at step 0 (its process was asked to stop), to resume from the start: it "
            "saved no checkpoint; queued nothing new") in said
    call_command("train", "--bundle", "arith-bundle", "--steps", "10", "--if-idle")
    assert "run demo is already queued; queued nothing" in " ".join(capsys.readouterr().err.split())


def test_under_torchrun_a_run_trains_headless_only(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    with pytest.raises(CommandError, match="under torchrun .* add --headless"):
        call_command("train", "--bundle", "demo", "--steps", "1")
    assert distributed.current() is None  # no process group was joined

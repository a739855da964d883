"""`manage.py train`'s arguments: a new run needs a bundle and steps, `--resume ID` trains an existing one here,
and under torchrun (WORLD_SIZE > 1) a run trains only headless — refused before any process group is joined.
The 2-process training itself: tests/workers/rl/training/test_distributed.py."""

import pytest
from django.core.management import CommandError, call_command

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


def test_under_torchrun_a_run_trains_headless_only(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    with pytest.raises(CommandError, match="under torchrun .* add --headless"):
        call_command("train", "--bundle", "demo", "--steps", "1")
    assert distributed.current() is None  # no process group was joined

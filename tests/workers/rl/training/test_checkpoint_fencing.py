"""Checkpoints fenced by attempt, in the storage alone: an attempt records the step it resumed from before it
writes anything; an older attempt that still runs (its lease lost, the bucket still reachable) then publishes
nothing, and what it published after that step anyway is no checkpoint — never resumed from, removed by the next
save — while the newer attempt's checkpoints are never removed by it."""

import copy

import pytest
import torch

from workers.rl.models.policies import TinyLMPolicy
from workers.rl.protocols import LeaseLost
from workers.rl.training.checkpoint import (
    STEP_DIR,
    checkpoints,
    latest_checkpoint,
    load_checkpoint,
    resume_checkpoint,
    save_checkpoint,
)
from workers.rl.training.tracking import MemoryTracker
from workers.storage import Storage


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.s3)])
def run_root(request, tmp_path):
    """The URL of a run's checkpoint directory on each backend."""
    if request.param == "local":
        return str(tmp_path / "checkpoints" / "run")
    return request.getfixturevalue("object_store") + "/checkpoints/run"


@pytest.fixture
def policy(addition_base_model):
    return TinyLMPolicy(copy.deepcopy(addition_base_model))


def _save(storage, policy, step: int, *, attempt: int, keep: int = 5):
    return save_checkpoint(storage, step=step, policy=policy, trainer_state={"step": step},
                           pipeline_state={"step": step, "attempt": attempt}, keep=keep, attempt=attempt)


def _publish_late(storage: Storage, policy, step: int, *, attempt: int) -> None:
    """What an older attempt's upload looks like when it lands after a newer attempt resumed: it checked the
    fence before that, and publishes now."""
    staging = storage.stage(STEP_DIR.format(step))
    policy.save(staging / "model.safetensors")
    torch.save({"step": step}, staging / "trainer.pt")
    (staging / "pipeline.json").write_text(f'{{"step": {step}, "attempt": {attempt}}}')
    storage.publish(STEP_DIR.format(step), staging, step=step, attempt=attempt)


def test_an_attempt_that_lost_the_run_publishes_no_checkpoint_once_a_newer_one_resumed(run_root, tmp_path, policy):
    zombie, successor = Storage(run_root, cache=tmp_path / "a"), Storage(run_root, cache=tmp_path / "b")
    _save(zombie, policy, 2, attempt=1)
    _save(zombie, policy, 4, attempt=1)
    assert resume_checkpoint(successor, attempt=2).step == 4

    with pytest.raises(LeaseLost, match="attempt 2 of this run resumed it from step 4"):
        _save(zombie, policy, 6, attempt=1)
    assert [(c.step, c.attempt) for c in checkpoints(successor)] == [(2, 1), (4, 1)]
    assert "step-000006" not in successor.names()
    with pytest.raises(LeaseLost):  # nor does it resume anything
        resume_checkpoint(zombie, attempt=1)


def test_what_an_older_attempt_published_after_a_newer_one_resumed_is_never_resumed_from(run_root, tmp_path, policy):
    zombie, successor = Storage(run_root, cache=tmp_path / "a"), Storage(run_root, cache=tmp_path / "b")
    _save(zombie, policy, 2, attempt=1)
    assert resume_checkpoint(successor, attempt=2).step == 2
    _publish_late(zombie, policy, 4, attempt=1)
    _publish_late(zombie, policy, 8, attempt=1)

    reader = Storage(run_root, cache=tmp_path / "c")
    assert [c.step for c in checkpoints(reader)] == [2] and latest_checkpoint(reader).step == 2
    assert resume_checkpoint(reader, attempt=3).step == 2  # a third attempt does not take it either

    # The successor writes the same step again: its own checkpoint replaces the late one. Its next save removes
    # what is left of the older attempt's late ones.
    successor_storage = Storage(run_root, cache=tmp_path / "d")
    resume_checkpoint(successor_storage, attempt=4)
    saved, removed = _save(successor_storage, policy, 4, attempt=4)
    assert (saved.step, saved.attempt, removed) == (4, 4, [8])
    assert [(c.step, c.attempt) for c in checkpoints(reader)] == [(2, 1), (4, 4)]
    assert successor_storage.names() == ["attempts", "step-000002", "step-000004"]
    assert load_checkpoint(latest_checkpoint(reader), policy=policy)[1] == {"step": 4, "attempt": 4}


def test_retention_never_removes_a_newer_attempts_checkpoints(run_root, tmp_path, policy):
    zombie, successor = Storage(run_root, cache=tmp_path / "a"), Storage(run_root, cache=tmp_path / "b")
    for step in (2, 4):
        _save(zombie, policy, step, attempt=1)
    resume_checkpoint(successor, attempt=2)
    removed = [_save(successor, policy, step, attempt=2, keep=2)[1] for step in (6, 8)]
    assert removed == [[2], [4]]  # the older attempt's, as any retention

    with pytest.raises(LeaseLost):
        _save(zombie, policy, 10, attempt=1, keep=1)
    assert [(c.step, c.attempt) for c in checkpoints(successor)] == [(6, 2), (8, 2)]


def test_a_checkpoint_written_before_attempts_were_recorded_still_resumes(run_root, tmp_path, policy):
    storage = Storage(run_root, cache=tmp_path / "a")
    staging = storage.stage(STEP_DIR.format(3))
    policy.save(staging / "model.safetensors")
    torch.save({"step": 3}, staging / "trainer.pt")
    (staging / "pipeline.json").write_text('{"step": 3}')
    storage.publish(STEP_DIR.format(3), staging, step=3)  # its manifest names no attempt

    resumed = resume_checkpoint(Storage(run_root, cache=tmp_path / "b"), attempt=7)
    assert (resumed.step, resumed.attempt) == (3, 0)
    assert load_checkpoint(resumed, policy=policy)[1] == {"step": 3}
    assert [c.step for c in checkpoints(storage)] == [3]


def test_a_pipeline_of_an_attempt_a_newer_one_replaced_stops_before_writing(make_pipeline, tmp_path):
    newer, _ = make_pipeline(2, mode="sync", checkpoint_dir=tmp_path / "run", tracker=MemoryTracker(attempt=2))
    assert newer.run()["outcome"] == "completed"
    older, tracker = make_pipeline(4, mode="sync", checkpoint_dir=tmp_path / "run", tracker=MemoryTracker(attempt=1))
    with pytest.raises(LeaseLost, match="attempt 2"):
        older.run()
    assert tracker.steps == [] and [(c.step, c.attempt) for c in checkpoints(tmp_path / "run")] == [(2, 2)]

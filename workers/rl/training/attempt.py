"""What every training loop of an attempt does alike (the GRPO pipeline, workers/rl/pipeline.py, and the SFT and
DPO one, supervised_pipeline.py): decide whether the attempt may go on, and write a checkpoint and report it."""

from __future__ import annotations

import threading

from workers.storage import Storage, StorageUnavailable

from ..protocols import AttemptAbandoned, LeaseLost, Policy, Tracker
from .checkpoint import save_checkpoint
from .tracking import Heartbeat


class CheckpointError(RuntimeError):
    """A checkpoint could not be written; the newest complete one is still there to resume from."""


def check_attempt(*, run_id: str, heartbeat: Heartbeat, stop: threading.Event | None, step: int) -> None:
    """Raises LeaseLost (another worker took the run) or AttemptAbandoned (the process is stopping, or the
    attempt made no progress for too long) where the attempt may not go on."""
    if heartbeat.lease_lost:
        raise LeaseLost(f"run {run_id} was taken over by another worker")
    if stop is not None and stop.is_set():
        raise AttemptAbandoned(f"the process is stopping at step {step}")
    if heartbeat.stalled:
        raise AttemptAbandoned(f"no progress for {heartbeat.stuck_after:g} s at step {step}")


def write_checkpoint(store: Storage, *, step: int, policy: Policy, trainer_state: dict, pipeline_state: dict,
                     keep: int, tracker: Tracker, heartbeat: Heartbeat) -> None:
    """The checkpoint of `step`, written whole and reported to the tracker (the heartbeat counts it as progress).
    A newer attempt or an object store that stayed away stops this attempt (the run goes on from its newest
    checkpoint); anything else — a full disk, a lost mount — is a CheckpointError that says where."""
    try:
        checkpoint, removed = save_checkpoint(store, step=step, policy=policy, trainer_state=trainer_state,
                                              pipeline_state=pipeline_state, keep=keep, attempt=tracker.attempt)
    except (LeaseLost, StorageUnavailable):
        raise  # not the run's fault (apps/runs/attempts/)
    except Exception as exc:
        raise CheckpointError(f"could not write the checkpoint of step {step} to {store}: {exc} (the checkpoints "
                              "before it are intact)") from exc
    heartbeat.progressed()
    tracker.checkpoint(step=checkpoint.step, path=str(checkpoint.path), size=checkpoint.size, removed=removed)

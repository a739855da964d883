"""The training loop, written once: GRPO (workers/rl/pipeline.py), SFT and DPO (supervised_pipeline.py) each extend
`TrainingLoop` with their own step, and so does every kind after them (an external run's step records the episodes
another trainer rolled out; partial rollouts change what GRPO's step collects).

`TrainingLoop.run` reads top to bottom:

    restore      the newest checkpoint: the trainer's state and the weights, the counters, then the algorithm's own
                 (`restore_state`); `before_restore` runs first (DPO: its reference, from the weights it starts from)
    started      the algorithm's preparations (GRPO: hand the engine the weights, evaluate)
    steps        (check → train_step → record → checkpoint when due) until the last step, a pause, a cancel or a stop
    ended        the algorithm's wind-down (GRPO: stop collecting, evaluate a completed run)
    summary      run, outcome, steps, resumed_from_step, wall_seconds, then the algorithm's `summary_fields`

What every algorithm gets alike:

- Checks (`check`): at each step's start, before each step is recorded, and wherever the step waits (GRPO's
  collectors call it every 50 ms). Another attempt took the run: LeaseLost. No progress for `stuck_after` seconds
  (the heartbeat then stops too, so the watchdog takes the run for lost): AttemptAbandoned, the run left to be
  resumed from its newest checkpoint. Either ends the attempt without a word on the run.
- A stop its process was asked for (`stop`: the embedded studio's Ctrl-C or SIGTERM, apps/runs/embedded.py): the
  step under way is dropped, the last finished step is checkpointed if it was not (from the state kept at its end,
  so it is the checkpoint that step would have written), and the outcome is "interrupted": the run resumes from
  that step. A step already trained when the stop comes is recorded first. An update, a checkpoint or an
  evaluation under way is not interrupted: it ends first, or the process's own stop deadline ends it.
- Pause and cancel, which the heartbeat brings from the run's owner, land at a step's end; a pause checkpoints it.
- Checkpoints every `checkpoint_every` steps and at the last, fenced by attempt (checkpoint.py) and reported to the
  tracker, which the heartbeat counts as progress.
- Counters: a dataclass per algorithm (`Counters`), kept in every checkpoint and restored with it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from workers.storage import Storage, StorageUnavailable

from ..config import TrainingConfig
from ..models.allocator import give_back_free_heap_pages
from ..protocols import AttemptAbandoned, LeaseLost, Policy, Tracker
from .checkpoint import checkpoint_storage, load_checkpoint, resume_checkpoint, save_checkpoint
from .tracking import Heartbeat

COMPLETED, PAUSED, CANCELLED, INTERRUPTED = "completed", "paused", "cancelled", "interrupted"


class CheckpointError(RuntimeError):
    """A checkpoint could not be written; the newest complete one is still there to resume from."""


class StopAsked(Exception):
    """The attempt's process was asked to stop: the loop ends as interrupted at its last finished step."""


class Counters(Protocol):
    """An algorithm's running totals (GRPO's rollout/metrics.RunCounters, SFT's and DPO's SupervisedCounters)."""

    def state(self) -> dict: ...

    @classmethod
    def from_state(cls, state: dict) -> Counters: ...


class LoopTrainer(Protocol):
    """What the loop asks of a trainer: the steps it has trained, and its state (everything but the weights)."""

    step: int

    def state(self) -> dict: ...

    def restore(self, state: dict) -> None: ...


@dataclass(frozen=True)
class StepRecord:
    """What a step hands the tracker: its metric points, the trajectories it archives, its events."""

    points: dict[str, float]
    trajectories: list = field(default_factory=list)
    events: list[tuple[str, str, dict]] = field(default_factory=list)


@dataclass(frozen=True)
class FinishedStep:
    """A recorded step as its checkpoint keeps it, taken at its end: written then when due, or later by a pause or
    a stop (the weights do not change until the next update, which the loop never interrupts)."""

    step: int
    trainer_state: dict
    loop_state: dict


class TrainingLoop:
    def __init__(self, *, run_id: str, config: TrainingConfig, total_steps: int, policy: Policy, trainer: LoopTrainer,
                 counters: Counters, tracker: Tracker, checkpoint_dir: Path | Storage,
                 progress: Callable | None = None, stop: threading.Event | None = None,
                 stuck_after: float | None = None):
        self.run_id, self.config, self.total_steps = run_id, config, total_steps
        self.policy, self.trainer, self.counters, self.tracker = policy, trainer, counters, tracker
        self.checkpoint_dir = checkpoint_storage(checkpoint_dir)
        self.progress, self.stop = progress, stop
        self.heartbeat = Heartbeat(tracker, stuck_after=stuck_after)
        self.record_seconds = 0.0  # the previous step's record, checkpoint and beat
        self._finished: FinishedStep | None = None
        self._last_saved: int | None = None  # the step of the newest checkpoint

    # --- what an algorithm writes ---------------------------------------------------------------------------------

    def train_step(self) -> StepRecord:
        """One step: train (the trainer's step goes up by one) and return what to record."""
        raise NotImplementedError

    def before_restore(self, resume_step: int) -> None:
        """Before the checkpoint of `resume_step` (0: none) replaces the weights the run starts from."""

    def restore_state(self, state: dict) -> str:
        """The algorithm's part of a checkpoint's state (`loop_state`); returns what it restored, in words."""
        return ""

    def loop_state(self) -> dict:
        """What a checkpoint keeps of the algorithm beside the weights, the trainer's state and the counters."""
        return {}

    def started(self, resumed_from: int | None) -> None:
        """After the restore, before the first step."""

    def ended(self, outcome: str) -> None:
        """After the last step (or the pause, cancel or stop), before a paused or interrupted run's checkpoint."""

    def summary_fields(self, outcome: str) -> dict:
        return {}

    def close(self) -> None:
        """On every way out."""

    # --- the run ----------------------------------------------------------------------------------------------------

    def run(self) -> dict:
        """Train to `total_steps`, or until paused, cancelled or stopped; returns the summary."""
        began = time.monotonic()
        resumed_from = None
        self.heartbeat.start()  # before the restore: a DPO run's reference pass, a large model's load take a while
        try:
            try:
                resumed_from = self._restore()
                self.started(resumed_from)
                outcome = self._steps()
            except StopAsked:
                outcome = INTERRUPTED
            self.ended(outcome)
            if outcome in (PAUSED, INTERRUPTED) and self._finished is not None \
                    and self._last_saved != self._finished.step:
                self._save(self._finished)
            return {"run": self.run_id, "outcome": outcome, "steps": self.trainer.step,
                    "resumed_from_step": resumed_from, "wall_seconds": round(time.monotonic() - began, 2),
                    **self.summary_fields(outcome)}
        finally:
            self.heartbeat.stop()  # only now: an evaluation at the end beats too, or the watchdog would take the run
            self.close()

    def _steps(self) -> str:
        while self.trainer.step < self.total_steps:
            self.check()
            self._record(self.train_step())
            if self.heartbeat.requested == "pause":
                return PAUSED
            if self.heartbeat.requested == "cancel":
                return CANCELLED
        return COMPLETED

    def check(self) -> None:
        """Whether the attempt may go on: raises LeaseLost, AttemptAbandoned or StopAsked where it may not."""
        self._check_held()
        if self.stop is not None and self.stop.is_set():
            raise StopAsked(f"the process was asked to stop at step {self.trainer.step}")

    def _check_held(self) -> None:
        if self.heartbeat.lease_lost:
            raise LeaseLost(f"run {self.run_id} was taken over by another worker")
        if self.heartbeat.stalled:
            raise AttemptAbandoned(f"no progress for {self.heartbeat.stuck_after:g} s at step {self.trainer.step}")

    def _record(self, record: StepRecord) -> None:
        began = time.monotonic()
        step = self.trainer.step
        self._check_held()  # not a stop: the step is trained, so it is recorded (and checkpointed) first
        self.tracker.step(step=step, wall_time=time.time(), points=record.points, trajectories=record.trajectories,
                          events=record.events)
        self.heartbeat.progressed()
        self._finished = FinishedStep(step, self.trainer.state(),
                                      {"step": step, "counters": self.counters.state(), **self.loop_state()})
        if step % self.config.checkpoint_every == 0 or step == self.total_steps:
            self._save(self._finished)
        self.heartbeat.beat()  # asked at every step's end as well as by the heartbeat thread: a pause lands here
        give_back_free_heap_pages()  # what the step freed, back to the OS: malloc's heaps fragment (allocator.py)
        self.record_seconds = time.monotonic() - began
        if self.progress:
            self.progress(step, self.total_steps, record.points)

    # --- checkpoints ------------------------------------------------------------------------------------------------

    def _save(self, finished: FinishedStep) -> None:
        """The checkpoint of `finished`, written whole and reported to the tracker. A newer attempt or an object store
        that stayed away stops this attempt (the run goes on from its newest checkpoint); anything else — a full
        disk, a lost mount — is a CheckpointError that says where."""
        try:
            checkpoint, removed = save_checkpoint(self.checkpoint_dir, step=finished.step, policy=self.policy,
                                                  trainer_state=finished.trainer_state,
                                                  pipeline_state=finished.loop_state,
                                                  keep=self.config.keep_checkpoints, attempt=self.tracker.attempt)
        except (LeaseLost, StorageUnavailable):
            raise  # not the run's fault (apps/runs/attempts/)
        except Exception as exc:
            raise CheckpointError(f"could not write the checkpoint of step {finished.step} to {self.checkpoint_dir}: "
                                  f"{exc} (the checkpoints before it are intact)") from exc
        self.heartbeat.progressed()
        self.tracker.checkpoint(step=checkpoint.step, path=str(checkpoint.path), size=checkpoint.size,
                                removed=removed)
        self._last_saved = finished.step

    def _restore(self) -> int | None:
        """Continue from the newest checkpoint, if there is one; returns its step. What earlier attempts archived
        after it is taken back: this attempt writes it again. The storage records which step this attempt resumed
        from, which fences off what older attempts still write (checkpoint.py)."""
        checkpoint = resume_checkpoint(self.checkpoint_dir, attempt=self.tracker.attempt)
        self.before_restore(checkpoint.step if checkpoint is not None else 0)
        if checkpoint is None:
            self.tracker.rollback(0)
            return None
        trainer_state, state = load_checkpoint(checkpoint, policy=self.policy, device=self.policy.device)
        self.trainer.restore(trainer_state)
        self.counters = type(self.counters).from_state(state["counters"])
        restored = self.restore_state(state)
        self._last_saved = checkpoint.step
        self.tracker.rollback(checkpoint.step)
        self.tracker.event("resumed", f"resumed from the checkpoint at step {checkpoint.step}"
                                      + (f": {restored}" if restored else ""), step=checkpoint.step)
        return checkpoint.step

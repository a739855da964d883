"""An SFT or DPO run from start to end, the engine-free path: nothing is sampled, nothing verified.

`SupervisedPipeline.run` reads top to bottom: restore the newest checkpoint (for DPO, first the reference's
log-probabilities with the weights the run starts from) → (take the step's rows, train, record the step,
checkpoint) until the last step or a pause → summary. The rows of each step follow from the seed alone
(datasets.step_rows), and a checkpoint holds the weights, the optimizer, the schedule and the RNG, so a run killed
at any point and resumed from its newest checkpoint trains exactly as if it had never stopped. Checkpoints,
heartbeats, the pause/cancel requests and abandoning a stopping attempt work as in the GRPO pipeline
(workers/rl/pipeline.py), through the same checkpoint store and tracker.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

from workers.storage import Storage

from ..config import RunConfig
from ..protocols import Policy, Tracker, TrainingChat
from .attempt import check_attempt, write_checkpoint
from .checkpoint import checkpoint_storage, load_checkpoint, resume_checkpoint
from .datasets import SFT, ConversationRow, PreferenceRow, step_rows
from .supervised import DPOTrainer, PairRow, SFTTrainer, SupervisedStats, TokenRow, truncated
from .tracking import Heartbeat


def tokenize_row(chat: TrainingChat, row: ConversationRow | PreferenceRow) -> TokenRow | PairRow:
    """A dataset row as the trainer takes it: a TokenRow (SFT), or a PairRow (DPO) whose answers are trained on
    their assistant messages after the shared prompt."""
    try:
        if isinstance(row, ConversationRow):
            return TokenRow(*map(tuple, chat.training_tokens(list(row.messages), list(row.tools))))
        prompt = list(row.prompt)
        chosen = chat.training_tokens(prompt + list(row.chosen), list(row.tools), trained_from=len(prompt))
        rejected = chat.training_tokens(prompt + list(row.rejected), list(row.tools), trained_from=len(prompt))
        return PairRow(TokenRow(*map(tuple, chosen)), TokenRow(*map(tuple, rejected)))
    except ValueError as exc:
        raise ValueError(f"dataset line {row.line}: {exc}") from None


def fitted(row: TokenRow | PairRow, max_length: int | None) -> TokenRow | PairRow:
    """The row cut to the model's context (each answer of a pair on its own), keeping its start."""
    if isinstance(row, PairRow):
        return PairRow(truncated(row.chosen, max_length), truncated(row.rejected, max_length))
    return truncated(row, max_length)


class SupervisedPipeline:
    def __init__(self, *, run_id: str, kind: str, config: RunConfig, total_steps: int, rows: list, policy: Policy,
                 chat: TrainingChat, tracker: Tracker, checkpoint_dir: Path | Storage,
                 progress: Callable | None = None, stop: threading.Event | None = None,
                 stuck_after: float | None = None):
        self.run_id, self.kind, self.config, self.total_steps = run_id, kind, config, total_steps
        self.rows, self.policy, self.chat, self.tracker = rows, policy, chat, tracker
        trainer_class = SFTTrainer if kind == SFT else DPOTrainer
        self.trainer = trainer_class(policy, config=config, total_steps=total_steps)
        self.checkpoint_dir = checkpoint_storage(checkpoint_dir)
        self.progress, self.stop = progress, stop
        self.heartbeat = Heartbeat(tracker, stuck_after=stuck_after)
        limits = [n for n in (getattr(policy, "max_context", None), config.context_length) if n]
        self.max_length = min(limits) if limits else None
        self._tokenized: dict[int, TokenRow | PairRow] = {}
        self._truncated: set[int] = set()  # rows longer than the context, cut
        self.counters = {"tokens": 0, "trained_tokens": 0, "active_seconds": 0.0, "first_loss": None,
                         "last_loss": None}
        self._last_saved: int | None = None

    # --- the run -------------------------------------------------------------------------------------------

    def run(self) -> dict:
        started = time.monotonic()
        self.heartbeat.start()  # before the restore: a DPO run's reference pass over its rows takes a while
        try:
            resumed_from = self._restore()
            outcome = self._train()
            if outcome == "paused" and self._last_saved != self.trainer.step:
                self._save_checkpoint()
        finally:
            self.heartbeat.stop()
        counters = self.counters
        return {"run": self.run_id, "outcome": outcome, "kind": self.kind, "steps": self.trainer.step,
                "resumed_from_step": resumed_from, "dataset_rows": len(self.rows),
                "rows_per_step": self.config.batch_size, "first_loss": counters["first_loss"],
                "last_loss": counters["last_loss"], "tokens": counters["tokens"],
                "trained_tokens": counters["trained_tokens"], "truncated_rows_seen": len(self._truncated),
                "tokens_per_second": round(counters["tokens"] / max(counters["active_seconds"], 1e-9), 1),
                "wall_seconds": round(time.monotonic() - started, 2)}

    def _train(self) -> str:
        while self.trainer.step < self.total_steps:
            self._check()
            step = self.trainer.step + 1
            batch = self._batch(step)
            stats = self.trainer.train(batch)
            self._record(step, stats)
            if self.heartbeat.requested == "pause":
                return "paused"
            if self.heartbeat.requested == "cancel":
                return "cancelled"
        return "completed"

    def _check(self) -> None:
        check_attempt(run_id=self.run_id, heartbeat=self.heartbeat, stop=self.stop, step=self.trainer.step)

    def _batch(self, step: int) -> list:
        return [self._row(index) for index in
                step_rows(len(self.rows), batch=self.config.batch_size, step=step, seed=self.config.seed)]

    def _row(self, index: int) -> TokenRow | PairRow:
        if index not in self._tokenized:
            row = tokenize_row(self.chat, self.rows[index])
            cut = fitted(row, self.max_length)
            if cut != row:
                self._truncated.add(index)
            self._tokenized[index] = cut
        return self._tokenized[index]

    def _record(self, step: int, stats: SupervisedStats) -> None:
        counters = self.counters
        counters["tokens"] += stats.tokens
        counters["trained_tokens"] += stats.trained_tokens
        counters["active_seconds"] += stats.seconds
        counters["first_loss"] = stats.loss if counters["first_loss"] is None else counters["first_loss"]
        counters["last_loss"] = stats.loss
        points = {f"loss/{self.kind}": stats.loss, "optimizer/learning_rate": stats.learning_rate,
                  "optimizer/grad_norm": stats.grad_norm,
                  "throughput/sequence_tokens_per_second": stats.tokens / max(stats.seconds, 1e-9),
                  "throughput/trained_tokens_per_second": stats.trained_tokens / max(stats.seconds, 1e-9),
                  "trainer/step_seconds": stats.seconds,
                  "data/epoch": step * self.config.batch_size / len(self.rows), **stats.extra}
        self._check()
        self.tracker.step(step=step, wall_time=time.time(), points=points, trajectories=[], events=[])
        self.heartbeat.progressed()
        if step % self.config.checkpoint_every == 0 or step == self.total_steps:
            self._save_checkpoint()
        self.heartbeat.beat()  # a pause asked for lands at this step's end
        if self.progress:
            self.progress(step, self.total_steps, points)

    # --- checkpoints -----------------------------------------------------------------------------------------

    def _save_checkpoint(self) -> None:
        write_checkpoint(self.checkpoint_dir, step=self.trainer.step, policy=self.policy,
                         trainer_state=self.trainer.state(),
                         pipeline_state={"step": self.trainer.step, "counters": self.counters},
                         keep=self.config.keep_checkpoints, tracker=self.tracker, heartbeat=self.heartbeat)
        self._last_saved = self.trainer.step

    def _restore(self) -> int | None:
        """Continue from the newest checkpoint, if any; returns its step. A DPO run first computes the reference's
        log-probabilities of every row it has still to train on, with the weights it starts from (the checkpoint
        replaces them)."""
        checkpoint = resume_checkpoint(self.checkpoint_dir, attempt=self.tracker.attempt)
        done = checkpoint.step if checkpoint is not None else 0
        if isinstance(self.trainer, DPOTrainer):
            pairs = [self._row(i) for step in range(done + 1, self.total_steps + 1) for i in
                     step_rows(len(self.rows), batch=self.config.batch_size, step=step, seed=self.config.seed)]
            self.trainer.precompute_reference(pairs, progressed=self.heartbeat.progressed)
            self._check()
        if checkpoint is None:
            self.tracker.rollback(0)
            return None
        trainer_state, state = load_checkpoint(checkpoint, policy=self.policy, device=self.policy.device)
        self.trainer.restore(trainer_state)
        self.counters.update(state["counters"])
        self._last_saved = checkpoint.step
        self.tracker.rollback(checkpoint.step)
        self.tracker.event("resumed", f"resumed from the checkpoint at step {checkpoint.step}", step=checkpoint.step)
        return checkpoint.step

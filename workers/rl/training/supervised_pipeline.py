"""An SFT or DPO run from start to end, the engine-free path: nothing is sampled, nothing verified.

`SupervisedPipeline` is the training loop (loop.py: restore → (check, step, record, checkpoint) until the last step,
a pause or a stop → summary, with the checks, the heartbeat and the checkpoints GRPO's pipeline has too). Its own
part: before the restore, a DPO run computes the reference's log-probabilities with the weights the run starts from;
a step takes its rows and trains on them. The rows of each step follow from the seed alone (datasets.step_rows), and
a checkpoint holds the weights, the optimizer, the schedule and the RNG, so a run killed at any point and resumed
from its newest checkpoint trains exactly as if it had never stopped.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from workers.storage import Storage

from ..config import SFTConfig
from ..protocols import Policy, Tracker, TrainingChat
from .data_files import SFT, ConversationRow, PreferenceRow, step_rows
from .loop import StepRecord, TrainingLoop
from .supervised import DPOTrainer, PairRow, SFTTrainer, TokenRow, truncated


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


@dataclass
class SupervisedCounters:
    tokens: int = 0  # sequence tokens trained through
    trained_tokens: int = 0  # of them, the ones the loss is on
    active_seconds: float = 0.0  # the trainer's
    first_loss: float | None = None
    last_loss: float | None = None

    def state(self) -> dict:
        return asdict(self)

    @classmethod
    def from_state(cls, state: dict) -> SupervisedCounters:
        return cls(**state)


class SupervisedPipeline(TrainingLoop):
    def __init__(self, *, run_id: str, kind: str, config: SFTConfig, total_steps: int, rows: list, policy: Policy,
                 chat: TrainingChat, tracker: Tracker, checkpoint_dir: Path | Storage,
                 progress: Callable | None = None, stop: threading.Event | None = None,
                 stuck_after: float | None = None):
        trainer = (SFTTrainer if kind == SFT else DPOTrainer)(policy, config=config, total_steps=total_steps)
        super().__init__(run_id=run_id, config=config, total_steps=total_steps, policy=policy, trainer=trainer,
                         counters=SupervisedCounters(), tracker=tracker, checkpoint_dir=checkpoint_dir,
                         progress=progress, stop=stop, stuck_after=stuck_after)
        self.kind, self.rows, self.chat = kind, rows, chat
        limits = [n for n in (getattr(policy, "max_context", None), config.context_length) if n]
        self.max_length = min(limits) if limits else None
        self._tokenized: dict[int, TokenRow | PairRow] = {}
        self._truncated: set[int] = set()  # rows longer than the context, cut

    def before_restore(self, resume_step: int) -> None:
        """A DPO run's reference: the log-probabilities of every row it has still to train on, with the weights it
        starts from (the checkpoint replaces them)."""
        if isinstance(self.trainer, DPOTrainer):
            pairs = [self._row(i) for step in range(resume_step + 1, self.total_steps + 1) for i in
                     step_rows(len(self.rows), batch=self.config.batch_size, step=step, seed=self.config.seed)]
            self.trainer.precompute_reference(pairs, progressed=self.heartbeat.progressed)
            self.check()

    def train_step(self) -> StepRecord:
        step = self.trainer.step + 1
        stats = self.trainer.train([self._row(index) for index in step_rows(
            len(self.rows), batch=self.config.batch_size, step=step, seed=self.config.seed)])
        counters = self.counters
        counters.tokens += stats.tokens
        counters.trained_tokens += stats.trained_tokens
        counters.active_seconds += stats.seconds
        counters.first_loss = stats.loss if counters.first_loss is None else counters.first_loss
        counters.last_loss = stats.loss
        return StepRecord({f"loss/{self.kind}": stats.loss, "optimizer/learning_rate": stats.learning_rate,
                           "optimizer/grad_norm": stats.grad_norm,
                           "throughput/sequence_tokens_per_second": stats.tokens / max(stats.seconds, 1e-9),
                           "throughput/trained_tokens_per_second": stats.trained_tokens / max(stats.seconds, 1e-9),
                           "trainer/step_seconds": stats.seconds,
                           "data/epoch": step * self.config.batch_size / len(self.rows), **stats.extra})

    def _row(self, index: int) -> TokenRow | PairRow:
        if index not in self._tokenized:
            row = tokenize_row(self.chat, self.rows[index])
            cut = fitted(row, self.max_length)
            if cut != row:
                self._truncated.add(index)
            self._tokenized[index] = cut
        return self._tokenized[index]

    def summary_fields(self, outcome: str) -> dict:
        counters = self.counters
        return {"kind": self.kind, "dataset_rows": len(self.rows), "rows_per_step": self.config.batch_size,
                "first_loss": counters.first_loss, "last_loss": counters.last_loss, "tokens": counters.tokens,
                "trained_tokens": counters.trained_tokens, "truncated_rows_seen": len(self._truncated),
                "tokens_per_second": round(counters.tokens / max(counters.active_seconds, 1e-9), 1)}

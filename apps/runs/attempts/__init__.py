"""A run's attempt, whatever its kind: `run_attempt` is what a worker calls with a run it claimed.

Called by the Celery task on the `gpu` queue, by the embedded studio's training and evaluation lanes, by
`manage.py train --headless` (and `evaluate --headless`, `reference_check`), and by rank 0 of a data-parallel
run's processes; all of them run the same code. Each kind is a small subclass of base.Attempt, which holds the one
failure policy; tracker.py writes what the attempt reports.
"""

from __future__ import annotations

from workers.telemetry import log_context

from ..models import Run, RunKind
from .base import Attempt, Unfinished, stop_on_signals
from .evaluation import EvaluationAttempt
from .reference import ReferenceAttempt
from .supervised import SupervisedAttempt
from .training import TrainingAttempt

ATTEMPTS: dict[str, type[Attempt]] = {
    RunKind.GRPO: TrainingAttempt,
    RunKind.SFT: SupervisedAttempt,
    RunKind.DPO: SupervisedAttempt,
    RunKind.EVALUATION: EvaluationAttempt,
    RunKind.REFERENCE: ReferenceAttempt,
}


def run_attempt(*, run_id, attempt: int, progress=None, pretrain_progress=None) -> dict | Unfinished:
    """Runs the attempt to its end; returns the summary, or how it stopped without a verdict (taken over, or left
    to be resumed)."""
    with log_context(run=run_id, attempt=attempt):  # every log line of the attempt names it
        run = Run.objects.select_related("bundle__definition__project", "project").get(pk=run_id)
        return ATTEMPTS[run.kind](run, attempt, progress=progress, pretrain_progress=pretrain_progress).carry_out()


__all__ = ["ATTEMPTS", "Unfinished", "run_attempt", "stop_on_signals"]

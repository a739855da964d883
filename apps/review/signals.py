"""Review reacts to what the runs app announces (apps/runs/signals.py): a queue that follows runs takes its share
of each step's trajectories once the step has committed."""

from __future__ import annotations

from django.dispatch import receiver

from apps.runs.signals import trajectories_archived

from .services import queue_follow


@receiver(trajectories_archived, dispatch_uid="review.follow_runs")
def follow_runs(sender, run, trajectory_ids: list[str], **_) -> None:
    queue_follow(run=run, trajectory_ids=trajectory_ids)

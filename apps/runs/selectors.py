"""Reads for runs: the list, one run, its place in the queue, its metric history (downsampled here, not in the
browser) and its events.

History and live updates meet by step: the page asks for everything after the last step it holds (and the
events after the last event id), so a reconnect fetches only what it missed.
"""

from __future__ import annotations

import math
import uuid
from collections import defaultdict
from dataclasses import dataclass

from django.db.models import Avg, Count, F, Max, Min, OuterRef, Q, QuerySet, Subquery, Sum
from django.http import Http404

from apps.trajectories.models import Trajectory
from workers.rl.tasks.overlap import task_label

from .domains import per_domain_q
from .embedded import LANES
from .models import ACTIVE_STATUSES, CLAIMABLE_STATUSES, MetricPoint, Run, RunEvent, RunKind, RunStatus

MAX_POINTS = 1000  # per series: enough for a chart as wide as a screen


def run_list(*, project, status: str | None = None, with_reward: bool = False) -> QuerySet[Run]:
    """Newest first; `with_reward` adds `reward_last`, the run's latest reward/mean (one subquery): a training
    run's last step (an evaluation's score is evaluation_scores')."""
    runs = Run.objects.filter(project=project).select_related("bundle__definition", "created_by")
    if with_reward:
        latest = MetricPoint.objects.filter(run=OuterRef("pk"), name="reward/mean").order_by("-step")
        runs = runs.annotate(reward_last=Subquery(latest.values("value")[:1]))
    return runs.filter(status=status) if status else runs


def evaluation_scores(runs: list[Run]) -> list[Run]:
    """`runs`, each evaluation among them with `score`: what the leaderboard shows for it (apps/evals/statistics.py,
    Score.mean), the mean over its tasks of each task's mean reward over its samples, answers the infrastructure
    failed left out; None while nothing is graded. Not its last batch's reward/mean, which is a few tasks' (one
    query for them all)."""
    evaluations = {run.pk: run for run in runs if run.kind == RunKind.EVALUATION}
    tasks: dict = defaultdict(lambda: defaultdict(lambda: [0.0, 0]))  # run -> task -> [sum of rewards, samples]
    for row in (Trajectory.objects.filter(run_id__in=list(evaluations), reward__isnull=False)
                .values("run_id", "template", "task_key").annotate(total=Sum("reward"), samples=Count("id"))):
        task = tasks[row["run_id"]][task_label(row["template"], row["task_key"])]
        task[0] += row["total"]
        task[1] += row["samples"]
    for pk, run in evaluations.items():
        means = [total / samples for total, samples in tasks[pk].values()]
        run.score = sum(means) / len(means) if means else None
    return runs


@dataclass(frozen=True)
class QueuePlace:
    """Where a queued run stands in its lane (embedded.py's LANES: training runs share one, evaluations have theirs):
    its place among the lane's queued and interrupted runs, claimed oldest first (1: next), and the runs that hold
    the lane now."""

    lane: str
    position: int
    ahead: list[Run]  # queued or interrupted before it, oldest first
    holding: list[Run]  # running in its lane


def run_queue_place(*, run: Run) -> QueuePlace | None:
    """`run`'s place in the queue of its lane, across projects as the lanes take runs; None unless it is queued."""
    if run.status != RunStatus.QUEUED:
        return None
    lane = "evaluation" if run.kind == RunKind.EVALUATION else "training"
    runs = LANES[lane](Run.objects.select_related("project"))
    ahead = list(runs.filter(status__in=CLAIMABLE_STATUSES).filter(
        Q(created_at__lt=run.created_at) | Q(created_at=run.created_at, pk__lt=run.pk)).order_by("created_at", "pk"))
    holding = list(runs.filter(status=RunStatus.RUNNING).order_by("started_at"))
    return QueuePlace(lane=lane, position=len(ahead) + 1, ahead=ahead, holding=holding)


@dataclass(frozen=True)
class ExternalTally:
    """What the page says of a run trained elsewhere: its trainer (client and model, as it named them) and the
    episodes recorded so far (external.py keeps the tally in the run's summary)."""

    client: str
    model: str
    episodes: int
    effective: int
    unfinished: list[tuple[str, int]]  # episodes that did not end on their own, by status: [("abandoned", 2)]


def external_tally(*, run: Run) -> ExternalTally | None:
    """None unless `run` is trained elsewhere."""
    if not run.is_external:
        return None
    summary, config = run.summary or {}, run.config or {}
    statuses = summary.get("statuses", {})
    return ExternalTally(client=config.get("client", ""), model=config.get("trainer_model", ""),
                         episodes=summary.get("episodes", 0), effective=summary.get("effective", 0),
                         unfinished=[(status, n) for status, n in sorted(statuses.items()) if status != "ok" and n])


def run_list_active(*, projects) -> QuerySet[Run]:
    """The queued and running runs of `projects`, evaluations among them (`run.evaluation`), newest first: what
    the landing page after log-in points to."""
    return (Run.objects.filter(project__in=projects, status__in=ACTIVE_STATUSES)
            .select_related("project", "bundle__definition", "evaluation__suite__definition"))


def run_get(*, project, run_id) -> Run:
    """The run if it belongs to `project`: another project's run is as absent as one that does not exist."""
    run = run_list(project=project).filter(pk=run_id).first()
    if run is None:
        raise Http404(f"No run {run_id} in this project.")
    return run


def runs_get(*, project, run_ids) -> list[Run]:
    """Runs of `project` in the order asked for; ids of other projects' runs, and ids that are no run's, are left
    out."""
    run_ids = [i for i in run_ids if _is_uuid(i)]
    found = {str(r.pk): r for r in run_list(project=project).filter(pk__in=run_ids)}
    return [found[str(i)] for i in run_ids if str(i) in found]


def metric_names(*, run: Run, per_domain: bool = True) -> list[str]:
    """The run's series, by name; without `per_domain`, its per-domain ones (reward/<domain> ...) left out."""
    points = MetricPoint.objects.filter(run=run)
    if not per_domain:
        points = points.exclude(per_domain_q())
    return list(points.values_list("name", flat=True).distinct().order_by("name"))


def metric_history(*, run: Run, after_step: int | None = None, names: list[str] | None = None,
                   max_points: int = MAX_POINTS, per_domain: bool = True) -> dict:
    """{"series": {name: {"step": [...], "wall_time": [...], "value": [...]}}, "last_step": n, "bucket": w}.

    Points after `after_step`, or every point without one: step 0 holds what was measured before training (the
    start-of-run evaluation), so "from the start" is not "after step 0". When a series holds more than
    `max_points` of them, consecutive steps are averaged in buckets of `w` steps (the point sits at the bucket's
    last step), in the database: a run of a million steps costs the page a thousand points a series. The last
    bucket may be partial; the browser replaces it with the raw points that follow. `last_step` is None while
    there is no point at all. Without `per_domain`, the per-domain series are left out (the run page reads those
    from its domains endpoint, domains.py).
    """
    points = MetricPoint.objects.filter(run=run)
    if not per_domain:
        points = points.exclude(per_domain_q())
    if after_step is not None:
        points = points.filter(step__gt=after_step)
    if names:
        points = points.filter(name__in=names)
    span = points.aggregate(low=Min("step"), high=Max("step"), n=Count("id"))
    series: dict[str, dict[str, list]] = {}
    if span["n"] == 0:
        return {"series": series, "last_step": after_step, "bucket": 1}
    width = max(1, math.ceil((span["high"] - span["low"] + 1) / max_points))
    if width == 1:
        rows = points.order_by("name", "step").values_list("name", "step", "wall_time", "value")
    else:
        # Integer division on both PostgreSQL and SQLite: steps low..low+w-1 share a bucket.
        rows = (points.annotate(bucket=(F("step") - span["low"]) / width).values("name", "bucket")
                .annotate(s=Max("step"), t=Max("wall_time"), v=Avg("value")).order_by("name", "bucket")
                .values_list("name", "s", "t", "v"))
    for name, step, wall_time, value in rows:
        entry = series.setdefault(name, {"step": [], "wall_time": [], "value": []})
        entry["step"].append(step)
        entry["wall_time"].append(wall_time)
        entry["value"].append(value)
    return {"series": series, "last_step": span["high"], "bucket": width}


def event_list(*, run: Run, after_id: int = 0, limit: int = 500) -> list[RunEvent]:
    """The run's events after event id `after_id`, oldest first (the newest `limit` when there are more)."""
    events = list(RunEvent.objects.filter(run=run, id__gt=after_id).order_by("-id")[:limit])
    return events[::-1]


def event_json(event: RunEvent) -> dict:
    return {"id": event.id, "kind": event.kind, "message": event.message, "step": event.step,
            "created_at": event.created_at.isoformat() if event.created_at else None}


def _is_uuid(text) -> bool:
    try:
        uuid.UUID(str(text))
    except ValueError:
        return False
    return True

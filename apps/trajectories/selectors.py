"""Reads for the trajectory archive: a keyset-paginated, filtered list, and one trajectory built for replay.

Pages are keyset-paginated (WHERE (key, id) beyond the last row seen, ORDER BY key, id, LIMIT n): the thousandth
page costs what the first does, where OFFSET would read and throw away every row before it. Each sort walks an
index that starts with the filters most pages use (the project, and the run or the status or the task) and ends
with the sort key and id (migrations 0002, 0003): every column of the condition in the index, so that no other
index costs nearly as little. No page counts rows: COUNT(*) over millions of rows is the slow part of a paginated
list.
"""

from __future__ import annotations

import base64
import json
import math
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime

from django.db.models import Q, QuerySet
from django.http import Http404

from apps.common.errors import StudioError
from apps.registry.categories import domains_in_categories, domains_in_category

from .models import Trajectory

PAGE_SIZE = 50
# sort name -> (column, descending, id descending); the id direction matches the index so one scan serves both.
SORTS = {
    "recent": ("finished_at", True, False),
    "oldest": ("finished_at", False, True),
    "reward_high": ("reward", True, True),
    "reward_low": ("reward", False, False),
    "slowest": ("duration_s", True, True),
}
FILTERS = ("run", "domain", "category", "template", "verifier", "status", "verdict_status", "deciding_layer",
           "policy_version", "task_key", "reward_min", "reward_max")
# Filters on a versioned reference: a value without "@N" matches every version of it.
ANY_VERSION = ("template", "verifier")
RANGES = {"reward_min": "reward__gte", "reward_max": "reward__lte"}
LIST_COLUMNS = ("id", "run_id", "run__name", "seq", "sample", "domain", "template", "task_key", "policy_version",
                "step", "effective", "advantage", "status", "reward", "verdict_status", "deciding_layer", "num_turns",
                "num_tool_calls", "completion_tokens", "duration_s", "cost", "finished_at")


class BadCursor(StudioError, ValueError):
    """A page's `after` cursor that no page of ours made (edited, cut short, or from another sort's column)."""


class BadFilter(StudioError, ValueError):
    """A filter value that cannot name anything (a run that is not a UUID, a policy version that is no number);
    its field is the filter's name."""


@dataclass
class TrajectoryPage:
    rows: list[Trajectory]
    next_cursor: str | None
    sort: str
    filters: dict = field(default_factory=dict)


def cursor_encode(value, pk) -> str:
    if isinstance(value, datetime):
        value = {"t": value.isoformat()}
    return base64.urlsafe_b64encode(json.dumps([value, str(pk)]).encode()).decode().rstrip("=")


def cursor_decode(cursor: str, column: str):
    """(value, id) of the row a page ends at; the value of the type `column` holds, or BadCursor."""
    damaged = BadCursor("this page link is damaged; start again from the first page", field="after")
    try:
        value, pk = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
        pk = uuid.UUID(pk)
        if column == "finished_at":
            value = datetime.fromisoformat(value["t"]).astimezone(UTC)  # within datetime's years in UTC too
        elif isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise damaged
    except (ValueError, TypeError, KeyError, AttributeError, OverflowError):
        raise damaged from None
    return value, pk


def _checked_filters(filters: dict) -> dict:
    checks = (("run", uuid.UUID, "a run's id"), ("policy_version", int, "a whole number"),
              ("reward_min", _finite, "a number"), ("reward_max", _finite, "a number"))
    for name, kind, example in checks:
        if filters.get(name) not in (None, ""):
            try:
                if isinstance(filters[name], bool) or (kind is not _finite and isinstance(filters[name], float)):
                    raise TypeError
                kind(filters[name])
            except (ValueError, TypeError, AttributeError):
                raise BadFilter(f"{name} {filters[name]!r} is not {example}", field=name) from None
    for name, value in filters.items():
        if isinstance(value, str) and "\x00" in value:  # PostgreSQL refuses the query itself: a 500, not a 400
            raise BadFilter(f"{name} {value!r} holds a NUL character, which no stored value has", field=name)
    return filters


def _finite(value) -> float:
    number = float(value)
    if not math.isfinite(number):
        raise ValueError(value)
    return number


def trajectory_filter(*, project, filters: dict) -> QuerySet[Trajectory]:
    """The project's trajectories that every filter given selects; BadFilter for a value that names nothing."""
    rows = Trajectory.objects.filter(project=project)
    _checked_filters(filters)
    for name in FILTERS:
        value = filters.get(name)
        if value in (None, ""):
            continue
        if name in RANGES:
            rows = rows.filter(**{RANGES[name]: float(value)})
        elif name == "category":  # the domains of the category (their newest versions')
            rows = rows.filter(domain__in=domains_in_category(project, str(value)))
        elif name in ANY_VERSION and "@" not in str(value):
            rows = rows.filter(**{f"{name}__startswith": f"{value}@"})
        else:
            rows = rows.filter(**{name: value})
    return rows


def trajectory_page_rows(*, project, filters: dict, sort: str, after: str = "",
                         limit: int = PAGE_SIZE) -> QuerySet[Trajectory]:
    """The query of one page (its `limit` rows and one more, to tell whether a next page exists): what
    trajectory_page runs, and what `bench ui` and the plan tests explain."""
    column, descending, id_descending = SORTS.get(sort, SORTS["recent"])
    rows = trajectory_filter(project=project, filters=filters)
    if column == "reward":
        rows = rows.filter(reward__isnull=False)  # rows without a reward (infra errors) sort nowhere
    if after:
        value, pk = cursor_decode(after, column)
        beyond, tie = ("lt" if descending else "gt"), ("lt" if id_descending else "gt")
        # The redundant `column <= value` bounds the index range; the OR alone would be a filter on a full walk.
        rows = rows.filter(**{f"{column}__{beyond}e": value}).filter(
            Q(**{f"{column}__{beyond}": value}) | Q(**{column: value, f"id__{tie}": pk}))
    order = [f"{'-' if descending else ''}{column}", f"{'-' if id_descending else ''}id"]
    return rows.select_related("run").only(*LIST_COLUMNS).order_by(*order)[:limit + 1]


def trajectory_page(*, project, filters: dict | None = None, sort: str = "recent", after: str = "",
                    limit: int = PAGE_SIZE) -> TrajectoryPage:
    filters = {k: v for k, v in (filters or {}).items() if k in FILTERS and v not in (None, "")}
    sort = sort if sort in SORTS else "recent"
    page = list(trajectory_page_rows(project=project, filters=filters, sort=sort, after=after, limit=limit))
    next_cursor = None
    if len(page) > limit:
        page = page[:limit]
        last = page[-1]
        next_cursor = cursor_encode(getattr(last, SORTS[sort][0]), last.pk)
    return TrajectoryPage(rows=page, next_cursor=next_cursor, sort=sort, filters=filters)


def run_choices(*, project, limit: int = 100) -> QuerySet:
    """The project's newest runs, for the browser's run filter. Read through a row's foreign key: the archive lies
    below the runs app, which writes it, and does not import it."""
    runs = Trajectory._meta.get_field("run").related_model.objects
    return runs.filter(project=project).only("id", "name")[:limit]


def trajectory_get(*, project, trajectory_id) -> Trajectory:
    row = Trajectory.objects.select_related("run", "run__bundle__definition").filter(
        project=project, pk=trajectory_id).first()
    if row is None:
        raise Http404(f"No trajectory {trajectory_id} in this project.")
    return row


def trajectory_neighbours(*, trajectory: Trajectory) -> tuple[str | None, str | None]:
    """The previous and next trajectory of the same run, in draw order: what [ and ] step to."""
    same_run = Trajectory.objects.filter(run_id=trajectory.run_id)
    before = same_run.filter(Q(seq__lt=trajectory.seq) | Q(seq=trajectory.seq, sample__lt=trajectory.sample)) \
        .order_by("-seq", "-sample").values_list("id", flat=True).first()
    after = same_run.filter(Q(seq__gt=trajectory.seq) | Q(seq=trajectory.seq, sample__gt=trajectory.sample)) \
        .order_by("seq", "sample").values_list("id", flat=True).first()
    return before, after


def trajectory_same_task(*, trajectory: Trajectory, limit: int = 20) -> list[Trajectory]:
    """Other attempts at the same task (other samples of the group, other runs or checkpoints)."""
    return list(Trajectory.objects.filter(project_id=trajectory.project_id, task_key=trajectory.task_key,
                                          template__startswith=trajectory.template.split("@")[0] + "@")
                .exclude(pk=trajectory.pk).select_related("run").only(*LIST_COLUMNS)
                .order_by("-finished_at", "id")[:limit])


EXPLORER_SAMPLE = 20_000
SLICE_COLUMNS = ("domain", "template", "deciding_layer", "status", "verdict_status", "policy_version", "reward",
                 "cost", "duration_s")


def trajectory_slice(*, project, run=None, domains=(), categories=(), templates=(), layers=(), statuses=(),
                     policy_min: int | None = None, policy_max: int | None = None,
                     limit: int = EXPLORER_SAMPLE) -> list[dict]:
    """The explorer's rows: the newest `limit` trajectories matching the slice, only the columns it plots.
    Distributions over the newest 20,000 are what a person reads; they stay fast at millions of rows."""
    rows = Trajectory.objects.filter(project=project)
    if run:
        rows = rows.filter(run_id=_checked_filters({"run": run})["run"])
    for column, values in (("domain", domains), ("category", categories), ("template", templates),
                           ("deciding_layer", layers), ("status", statuses)):
        if values:
            if not isinstance(values, list | tuple) or not all(isinstance(v, str) for v in values):
                raise BadFilter(f"{column}: expected a list of names, not {values!r}"[:200], field=column)
            if column == "category":
                rows = rows.filter(domain__in=domains_in_categories(project, values))
            else:
                rows = rows.filter(**{f"{column}__in": list(values)})
    for bound, lookup in ((policy_min, "gte"), (policy_max, "lte")):
        if bound not in (None, ""):
            _checked_filters({"policy_version": bound})
            rows = rows.filter(**{f"policy_version__{lookup}": int(bound)})
    return list(rows.order_by("-finished_at", "id").values(*SLICE_COLUMNS)[:limit])

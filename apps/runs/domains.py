"""A run's reward by domain, for the run page's heatmap and table and the compare page: the per-domain series
(`reward/<domain>`, apps/common/series.py) of every domain at once, read in a few queries whatever the number of
domains, with the steps averaged into at most `buckets` buckets.

What one read costs is bounded by the domains times the buckets (in the database: one GROUP BY over the run's
per-domain points); what it returns is bounded by the page: a page of rows, each with its bucket means (the
heatmap's row and the sparkline), and the category means over every domain that matches (the heatmap's grouped
rows). A domain's `reward` is the mean of its last bucket with points (its sparkline's end: with a bucket a step,
its last point), its `change` that minus its first bucket's mean.

The domains are the run's bundle's (with their categories, apps/registry/categories.py) and any other domain its
points name (a run's metrics are its trainer's: one trained elsewhere may name a domain the bundle does not pin).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from django.db import connections
from django.db.models import Avg, Count, F, Max, Min, Q

from apps.common.series import EVAL_REWARD, OVERALL, REWARD, domain_of, eval_domain_of
from apps.registry.categories import NO_CATEGORY, bundle_domains, category_counts
from apps.trajectories.models import Trajectory

from .models import MetricPoint, Run

BUCKETS = 48
SORTS = ("domain", "category", "reward", "change", "trajectories")
PER_PAGE = (25, 50, 100)
NONE_CATEGORY = "(none)"  # how a filter names the uncategorised (a category is a slug: it cannot be this)


@dataclass
class DomainRow:
    domain: str
    category: str
    cells: list[float | None]  # the mean reward in each bucket (None: no point of this domain there)
    reward: float | None = None
    change: float | None = None
    last_step: int | None = None
    points: int = 0
    trajectories: int | None = None  # counted for the page's rows (for every row when sorted by it)
    evaluation: list[float] | None = None  # [first, last] eval/reward/<domain>, when the run evaluated it

    def summarise(self) -> None:
        filled = [v for v in self.cells if v is not None]
        if filled:
            self.reward = filled[-1]
            self.change = filled[-1] - filled[0] if len(filled) > 1 else None


@dataclass
class DomainQuery:
    """What the page asks for: a search, a category, a sort, a page."""

    search: str = ""
    category: str = ""  # "" for all; NONE_CATEGORY for the uncategorised
    sort: str = "domain"
    descending: bool = False
    page: int = 1
    per_page: int = PER_PAGE[0]
    buckets: int = BUCKETS

    @classmethod
    def from_params(cls, params, *, prefix: str = "", sorts: tuple[str, ...] = SORTS) -> DomainQuery:
        """From a request's query (`prefix` before each name: the compare page's are dq, dcategory, ...)."""
        def text(name, default=""):
            value = params.get(prefix + name, default)
            return value if isinstance(value, str) else default

        def number(name, default, low, high):
            try:
                return min(high, max(low, int(text(name, str(default)))))
            except (TypeError, ValueError):
                return default

        sort = text("sort", "domain")
        return cls(search=text("q").strip()[:100], category=text("category")[:100],
                   sort=sort if sort in sorts else "domain", descending=text("order") == "desc",
                   page=number("page", 1, 1, 1_000_000), per_page=number("per_page", PER_PAGE[0], 5, PER_PAGE[-1]),
                   buckets=number("buckets", BUCKETS, 4, 200))

    def paged(self, ordered: list) -> tuple[list, int, int]:
        """The page of `ordered` asked for (the last one when asked past it), its number and how many there are."""
        pages = max(1, math.ceil(len(ordered) / self.per_page))
        page = min(self.page, pages)
        return ordered[(page - 1) * self.per_page: page * self.per_page], page, pages

    def matches(self, row: DomainRow) -> bool:
        if self.search and self.search.lower() not in row.domain.lower():
            return False
        if self.category:
            return row.category == (NO_CATEGORY if self.category == NONE_CATEGORY else self.category)
        return True


@dataclass
class DomainTable:
    steps: list[int]  # each bucket's last step (the heatmap's x)
    bucket: int  # steps per bucket
    domains: int  # every domain of the run
    total: int  # the domains that match the search and the category
    categories: list[tuple[str, int]]  # every category of the run's domains, with its count
    page: int
    pages: int
    per_page: int
    sort: str
    descending: bool
    rows: list[DomainRow] = field(default_factory=list)
    # the heatmap's grouped rows: per category, the mean over its matching domains of their bucket means
    groups: list[dict] = field(default_factory=list)
    last_step: int | None = None
    evaluated: bool = False  # the run has eval/reward/<domain> points

    def to_json(self) -> dict:
        body = asdict(self)
        body["categories"] = [[name or NONE_CATEGORY, count] for name, count in self.categories]
        for row in [*body["rows"], *body["groups"]]:
            row["cells"] = [_short(v) for v in row["cells"]]
            row["category"] = row["category"] or NONE_CATEGORY
        for row in body["rows"]:
            row["reward"], row["change"] = _short(row["reward"]), _short(row["change"])
        return body


def _short(value: float | None) -> float | None:
    """Four decimals: what a heatmap's colour or a table's cell can show (a page of 100 rows of 48 buckets stays
    small)."""
    return None if value is None else round(value, 4)


def per_domain_q() -> Q:
    """The per-domain series (apps/common/series.py), as a filter on metric names."""
    return (Q(name__startswith=REWARD) | Q(name__startswith=EVAL_REWARD)) & ~Q(name__in=OVERALL)


def domain_points(run: Run):
    """The run's per-domain reward points (reward/<domain>), on the (run, name, step) index."""
    return MetricPoint.objects.filter(run=run, name__startswith=REWARD).exclude(name__in=OVERALL)


def domain_rows(run: Run, *, buckets: int = BUCKETS) -> tuple[dict[str, DomainRow], list[int], int, int | None]:
    """Every domain of the run with its bucket means: (rows by domain, the buckets' last steps, steps per bucket,
    the last step with a per-domain point). Two queries: the span, then the GROUP BY."""
    categories = {d.slug: d.category for d in bundle_domains(run.bundle)}
    points = domain_points(run)
    span = points.aggregate(low=Min("step"), high=Max("step"))
    rows: dict[str, DomainRow] = {}
    if span["low"] is None:
        width, steps = 1, []
    else:
        low, high = span["low"], span["high"]
        width = max(1, math.ceil((high - low + 1) / buckets))
        count = (high - low) // width + 1
        steps = [min(high, low + (i + 1) * width - 1) for i in range(count)]
        grouped = (points.annotate(bucket=(F("step") - low) / width).values("name", "bucket")
                   .annotate(v=Avg("value"), n=Count("id"), s=Max("step")).values_list("name", "bucket", "v", "n", "s"))
        by_name: dict[str, DomainRow] = {}
        for name, bucket, value, n, last in _raw(grouped):
            row = by_name.get(name)
            if row is None:
                domain = domain_of(name)
                row = by_name[name] = rows[domain] = DomainRow(domain, categories.get(domain, NO_CATEGORY),
                                                              [None] * count)
            row.cells[bucket] = value
            row.points += n
            if row.last_step is None or last > row.last_step:
                row.last_step = last
    for domain, category in categories.items():
        rows.setdefault(domain, DomainRow(domain, category, [None] * len(steps)))
    for row in rows.values():
        row.summarise()
    return rows, steps, width, span["high"]


def _raw(queryset) -> list[tuple]:
    """The rows of a values_list query as the database driver returns them: tens of thousands of (domain, bucket)
    rows, where the ORM's converters (one call per value) cost more than the query itself."""
    sql, params = queryset.query.sql_with_params()
    with connections[queryset.db].cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall()


def _trajectory_counts(run: Run, domains: list[str] | None) -> dict[str, int]:
    """Trajectories per domain (on the (run, domain) index); of `domains` only, unless None."""
    rows = Trajectory.objects.filter(run=run)
    if domains is not None:
        rows = rows.filter(domain__in=domains)
    return dict(rows.values("domain").annotate(n=Count("id")).values_list("domain", "n").order_by())


def _sort_key(sort: str):
    if sort in ("domain", "category"):
        return lambda r: (r.category, r.domain) if sort == "category" else r.domain
    return lambda r: getattr(r, sort)


def sorted_rows(rows: list, sort: str, descending: bool) -> list:
    """By `sort` (an attribute of the rows), rows without a value (no point yet) last either way; ties by domain."""
    return sorted_by(rows, _sort_key(sort), descending)


def sorted_by(rows: list, key, descending: bool) -> list:
    """By `key(row)`, rows it gives None last either way; ties by domain."""
    rows = sorted(rows, key=lambda r: r.domain)
    present = [r for r in rows if key(r) is not None]
    missing = [r for r in rows if key(r) is None]
    return sorted(present, key=key, reverse=descending) + missing


def domain_table(run: Run, query: DomainQuery) -> DomainTable:
    rows_by_domain, steps, width, last_step = domain_rows(run, buckets=query.buckets)
    every = list(rows_by_domain.values())
    matching = [r for r in every if query.matches(r)]
    if query.sort == "trajectories":
        counts = _trajectory_counts(run, None)
        for row in matching:
            row.trajectories = counts.get(row.domain, 0)
    shown, page, pages = query.paged(sorted_rows(matching, query.sort, query.descending))
    if query.sort != "trajectories":
        counts = _trajectory_counts(run, [r.domain for r in shown])
        for row in shown:
            row.trajectories = counts.get(row.domain, 0)
    evaluated = _evaluations(run, shown)
    table = DomainTable(steps=steps, bucket=width, domains=len(every), total=len(matching),
                        categories=category_counts(every), page=page, pages=pages, per_page=query.per_page,
                        sort=query.sort, descending=query.descending, rows=shown, last_step=last_step,
                        evaluated=evaluated)
    table.groups = [{"category": name, "domains": n, "cells": cells}
                    for name, n, cells in category_means(matching, lambda row: row.cells, len(steps))]
    return table


def _evaluations(run: Run, rows: list[DomainRow]) -> bool:
    """Each row's first and last evaluation reward (eval/reward/<domain>); whether the run has any."""
    evaluations = MetricPoint.objects.filter(run=run, name__startswith=EVAL_REWARD).exclude(name__in=OVERALL)
    if not rows:
        return evaluations.exists()
    by_domain: dict[str, list[float]] = {}
    names = [EVAL_REWARD + r.domain for r in rows]
    for name, value in evaluations.filter(name__in=names).order_by("name", "step").values_list("name", "value"):
        by_domain.setdefault(eval_domain_of(name), []).append(value)
    for row in rows:
        values = by_domain.get(row.domain)
        row.evaluation = [values[0], values[-1]] if values else None
    return bool(by_domain) or evaluations.exists()


def category_means(rows: list, values, width: int) -> list[tuple[str, int, list[float | None]]]:
    """Per category of `rows`, uncategorised last: how many rows, and column by column the mean of `values(row)`
    over the rows that have one (each domain weighs the same, however often it was drawn)."""
    sums: dict[str, list[list[float]]] = {}
    counts: dict[str, int] = {}
    for row in rows:
        totals = sums.setdefault(row.category, [[0.0, 0] for _ in range(width)])
        counts[row.category] = counts.get(row.category, 0) + 1
        for i, value in enumerate(values(row)):
            if value is not None:
                totals[i][0] += value
                totals[i][1] += 1
    return [(name or NONE_CATEGORY, counts[name], [total / n if n else None for total, n in sums[name]])
            for name in sorted(sums, key=lambda c: (c == NO_CATEGORY, c))]


COMPARE_SORTS = ("domain", "category", "reward", "difference")


@dataclass
class ComparedDomain:
    domain: str
    category: str
    rewards: list[float | None]  # each run's reward on the domain (its last bucket's mean), in the runs' order
    differences: list[float | None]  # each run after the first: its reward minus the first run's

    @property
    def reward(self) -> float | None:
        return self.rewards[0]

    @property
    def difference(self) -> float | None:
        return self.differences[0] if self.differences else None


@dataclass
class DomainComparison:
    rows: list[ComparedDomain]  # the page's
    domains: int
    total: int
    page: int
    pages: int
    categories: list[tuple[str, int]]
    # per category of the matching domains: each run's mean reward over them (each domain weighs the same)
    by_category: list[tuple[str, int, list[float | None]]]
    every: list[ComparedDomain] = field(default_factory=list, repr=False)  # every domain, unfiltered, by name


def domain_comparison(runs: list[Run], query: DomainQuery) -> DomainComparison:
    """The runs side by side, a domain a row: every run's reward on it, and each later run's difference from the
    first; searched, filtered, sorted (COMPARE_SORTS: `reward` is the first run's, `difference` the second's from
    it) and paged as the run page's table is."""
    per_run = [domain_rows(run, buckets=query.buckets)[0] for run in runs]
    categories: dict[str, str] = {}
    for rows in per_run:
        for domain, row in rows.items():
            if row.category or domain not in categories:
                categories[domain] = row.category
    compared = []
    for domain in sorted(categories):
        rewards = [rows[domain].reward if domain in rows else None for rows in per_run]
        base = rewards[0]
        compared.append(ComparedDomain(domain, categories[domain], rewards,
                                       [None if base is None or r is None else r - base for r in rewards[1:]]))
    matching = [c for c in compared if query.matches(c)]
    shown, page, pages = query.paged(sorted_rows(matching, query.sort, query.descending))
    return DomainComparison(rows=shown, domains=len(compared), total=len(matching), page=page, pages=pages,
                            categories=[(name or NONE_CATEGORY, n) for name, n in category_counts(compared)],
                            by_category=category_means(matching, lambda row: row.rewards, len(runs)),
                            every=compared)

"""A leaderboard's and a paired comparison's per-domain rows at hundreds of domains: a page of them, searched,
filtered by category (the suite's domain versions', apps/registry/categories.py) and sorted, with each category's
means above. The statistics behind a row (a bootstrap interval, tied groups; a paired bootstrap) are worked out
for the page's rows only; sorting and filtering read each domain's plain mean, which costs nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from apps.registry.categories import NO_CATEGORY, bundle_domains, category_counts
from apps.runs.domains import NONE_CATEGORY, DomainQuery, category_means, sorted_by

from . import results

COLUMNS = 8  # evaluations side by side in the breakdown, the best overall first, before "show all"


@dataclass
class BreakdownRow:
    domain: str
    category: str
    means: list[float | None]  # each column's mean score on the domain
    cells: list[tuple] = field(default_factory=list)  # per column: (score, tied group, clean, trained on)

    @property
    def spread(self) -> float | None:
        """How far apart the columns are on this domain: the best mean minus the worst."""
        present = [m for m in self.means if m is not None]
        return max(present) - min(present) if len(present) > 1 else None


@dataclass
class Breakdown:
    columns: list[results.Row]
    hidden_columns: int  # evaluations left out of the columns (shown with "show all")
    rows: list[BreakdownRow]  # the page's
    domains: int
    total: int
    page: int
    pages: int
    categories: list[tuple[str, int]]
    by_category: list[tuple[str, int, list[float | None]]]  # per category: each column's mean over its domains
    sorts: list[tuple[str, str]]  # (value, label) of every sort


def categories_of(suite) -> dict[str, str]:
    return {d.slug: d.category for d in bundle_domains(suite)}


def leaderboard_breakdown(board: results.Leaderboard, suite, query: DomainQuery, *, all_columns: bool,
                          sort: str) -> Breakdown:
    """The suite's domains as rows and its best evaluations (all of them with `all_columns`) as columns; `sort` is
    domain, category, spread or e<evaluation id> (that column's mean). The page's domains are scored in full."""
    columns = board.rows if all_columns else board.rows[:COLUMNS]
    categories = categories_of(suite)
    names = [d for d in board.domains if d != results.ALL]
    rows = [BreakdownRow(d, categories.get(d, NO_CATEGORY), [row.means.get(d) for row in columns]) for d in names]
    sorts = [("domain", "domain"), ("category", "category"), ("spread", "spread (best − worst)")] + [
        (f"e{row.evaluation.pk}", row.evaluation.label) for row in columns]
    by = {"domain": lambda r: r.domain, "category": lambda r: (r.category, r.domain), "spread": lambda r: r.spread}
    for index, row in enumerate(columns):
        by[f"e{row.evaluation.pk}"] = lambda r, i=index: r.means[i]
    matching = [r for r in rows if query.matches(r)]
    shown, page, pages = query.paged(sorted_by(matching, by.get(sort, by["domain"]), query.descending))
    board.score([r.domain for r in shown])
    for r in shown:
        r.cells = [(row.scores.get(r.domain), board.groups[r.domain].get(row.evaluation.pk), row.clean.get(r.domain),
                    row.overlapping.get(r.domain)) for row in columns]
    return Breakdown(columns=columns, hidden_columns=len(board.rows) - len(columns), rows=shown, domains=len(rows),
                     total=len(matching), page=page, pages=pages,
                     categories=[(c or NONE_CATEGORY, n) for c, n in category_counts(rows)],
                     by_category=category_means(matching, lambda row: row.means, len(columns)), sorts=sorts)


@dataclass
class PairedRow:
    domain: str
    category: str
    comparison: object  # statistics.Comparison
    verdict: str

    @property
    def difference(self):
        return self.comparison.difference

    @property
    def q_value(self):
        return self.comparison.q_value


PAIRED_SORTS = (("difference", "difference"), ("q_value", "q-value"), ("domain", "domain"), ("category", "category"))


def paired_breakdown(paired: results.Paired, b_label: str, query: DomainQuery, *, significant: bool) -> dict:
    """A paired comparison's domains as a page of rows (the overall row apart), searched, by category, only the
    significant ones if asked, sorted by PAIRED_SORTS."""
    categories = categories_of(paired.a.suite)
    rows = [PairedRow(d, categories.get(d, NO_CATEGORY), c, c.verdict_for(b_label))
            for d, c in paired.by_domain.items() if d != results.ALL]
    matching = [r for r in rows if query.matches(r) and (not significant or r.comparison.significant)]
    by = {"domain": lambda r: r.domain, "category": lambda r: (r.category, r.domain),
          "difference": lambda r: r.difference, "q_value": lambda r: r.q_value}
    shown, page, pages = query.paged(sorted_by(matching, by.get(query.sort, by["domain"]), query.descending))
    overall = paired.by_domain[results.ALL]
    return {"rows": shown, "total": len(matching),
            "domains": len(rows), "page": page, "pages": pages,
            "categories": [(c or NONE_CATEGORY, n) for c, n in category_counts(rows)],
            "overall": (overall, overall.verdict_for(b_label)),
            "significant": sum(r.comparison.significant for r in rows),
            "domain_names": {r.domain for r in matching}, "filtered": len(matching) != len(rows)}

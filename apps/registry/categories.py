"""Domains by category (DomainSpec.category), for the pages that list hundreds of domains: the run page's table,
the run form's weights and quotas, the compare pages, the leaderboard's breakdown, the trajectory browser and the
explorer group and filter by it.

Two readings, each one query however many domains there are:
- a bundle version's domains, as its lock pins them (what a run trained on): `bundle_domains`. A version never
  changes, so the answer is kept per version in this process (bounded).
- a project's domains by their newest version (what the trajectory browser and the explorer, which see every run's
  trajectories, group by): `project_domain_categories`, `domains_in_category`.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from threading import Lock

from .models import Version

NO_CATEGORY = ""  # a domain published before categories, or without one: the pages call it "(none)"


@dataclass(frozen=True, order=True)
class BundleDomain:
    slug: str
    category: str
    weight: float  # the domain's own sampling weight (a run's domain_weights replace it)

    @property
    def domain(self) -> str:  # what the pages' domain tables filter and sort by (apps/runs/domains.py)
        return self.slug


_KEPT = 64  # bundle versions whose domains this process keeps: a version is immutable, so they never go stale
_kept: OrderedDict[tuple[int, str], tuple[BundleDomain, ...]] = OrderedDict()
_kept_lock = Lock()


def bundle_domains(bundle: Version | None) -> tuple[BundleDomain, ...]:
    """The domains `bundle` pins, by slug, each with its category and weight (empty for no bundle)."""
    if bundle is None:
        return ()
    key = (bundle.pk, bundle.content_hash)  # the hash too: a test database may give a rolled-back version's id again
    with _kept_lock:
        if key in _kept:
            _kept.move_to_end(key)
            return _kept[key]
    pinned = {p.ref.slug: p.ref.number for p in bundle.lock.of_kind("domain")}
    rows = (Version.objects.filter(definition__project_id=bundle.definition.project_id, definition__kind="domain",
                                   definition__slug__in=list(pinned))
            .values_list("definition__slug", "number", "spec__category", "spec__sampling_weight"))
    found = sorted(BundleDomain(slug, category or NO_CATEGORY, float(weight if weight is not None else 1.0))
                   for slug, number, category, weight in rows if pinned.get(slug) == number)
    domains = tuple(found)
    with _kept_lock:
        _kept[key] = domains
        while len(_kept) > _KEPT:
            _kept.popitem(last=False)
    return domains


def category_counts(domains) -> list[tuple[str, int]]:
    """(category, how many of `domains` are in it), by name, the uncategorised last."""
    counts: dict[str, int] = {}
    for domain in domains:
        counts[domain.category] = counts.get(domain.category, 0) + 1
    return sorted(counts.items(), key=lambda item: (item[0] == NO_CATEGORY, item[0]))


def project_domain_categories(project) -> dict[str, str]:
    """Every domain of `project` -> the category of its newest version. One query over the project's domain
    versions (a correlated "newest version" subquery is what a planner without statistics makes a disaster of)."""
    categories: dict[str, str] = {}
    rows = (Version.objects.filter(definition__project=project, definition__kind="domain")
            .order_by("definition__slug", "number").values_list("definition__slug", "spec__category"))
    for slug, category in rows:
        categories[slug] = category or NO_CATEGORY  # the newest version comes last
    return categories


def project_categories(project) -> list[str]:
    """The categories the project's domains are in (newest versions), by name; the uncategorised left out."""
    return sorted({category for category in project_domain_categories(project).values() if category})


def domains_in_category(project, category: str) -> list[str]:
    """The slugs of the project's domains whose newest version is in `category`."""
    return domains_in_categories(project, [category])


def domains_in_categories(project, categories) -> list[str]:
    """The slugs of the project's domains whose newest version is in one of `categories` (a few hundred names at
    most: a filter on trajectories' domain takes them as a list, on its (run, domain) index)."""
    wanted = set(categories)
    return sorted(slug for slug, category in project_domain_categories(project).items() if category in wanted)

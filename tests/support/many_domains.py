"""Hundreds or thousands of small synthetic domains in one project, and a bundle over them (issue 43's scale).

Each domain has its own task template (a tiny addition task on the specimens' image and verifier) and a
category from CATEGORIES (reasoning-gym's folders, so the pages group them as they will group the real ones).
Everything is published through the registry's own services (version_publish), so the bundle is an ordinary,
valid one that a run can pin. That is two publishes a domain, about 15 ms together on PostgreSQL here: 100 domains
take under 2 s, 1,000 about 15 s (the bundle itself, its closure resolved in bulk, 150 ms). Tests take a few dozen,
once per module (many_domains_for_module).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from django.contrib.auth import get_user_model
from django.db import transaction

from apps.accounts.services import project_create
from apps.registry.models import Version
from apps.registry.services import version_publish
from tests.support.specimens import IMAGE_SPEC, TEMPLATE_SPEC, VERIFIER_SPEC

# reasoning-gym's folders, as the generated domains will carry them.
CATEGORIES = ("algebra", "algorithmic", "arc", "arithmetic", "code", "cognition", "games", "geometry", "graphs",
              "induction", "logic", "probability")


@dataclass(frozen=True)
class ManyDomains:
    project: object
    owner: object
    bundle: Version
    domains: tuple[str, ...]  # domain slugs, in order
    categories: dict[str, str]  # domain slug -> category

    def in_category(self, category: str) -> list[str]:
        return [slug for slug in self.domains if self.categories[slug] == category]


def domain_slug(prefix: str, index: int) -> str:
    return f"{prefix}-{index:04d}"


def template_instances(index: int, count: int) -> list[dict]:
    """`count` addition tasks, different for every domain (so no two templates share instance rows)."""
    return [{"key": f"t{k:03d}", "inputs": {"a": index, "b": k}, "hidden": {"answer": index + k}}
            for k in range(count)]


def publish_many_domains(*, project, author, count: int, instances: int = 4, prefix: str = "syn",
                         bundle_slug: str = "many", categories: tuple[str, ...] = CATEGORIES) -> ManyDomains:
    """Publish `count` domains (slugs prefix-0000...), each with its template (prefix-0000-t) of `instances`
    tasks, categories round-robin, and bundle `bundle_slug` over all of them; returns the bundle version."""
    def publish(kind, slug, spec, **extra):
        return version_publish(project=project, kind=kind, slug=slug, spec=spec, author=author, via="cli",
                               **extra).version

    publish("sandbox_image", "py-basic", IMAGE_SPEC)
    publish("verifier", "numeric", VERIFIER_SPEC)
    slugs, assigned = [], {}
    for index in range(count):
        slug = domain_slug(prefix, index)
        category = categories[index % len(categories)] if categories else ""
        publish("task_template", f"{slug}-t", TEMPLATE_SPEC, instances=template_instances(index, instances))
        publish("domain", slug, {"sampling_weight": 1.0, "category": category,
                                 "templates": [{"template": f"{slug}-t", "weight": 1.0}]})
        slugs.append(slug)
        assigned[slug] = category
    bundle = publish("bundle", bundle_slug, {"members": [f"domain/{slug}@latest" for slug in slugs]})
    return ManyDomains(project=project, owner=author, bundle=bundle, domains=tuple(slugs), categories=assigned)


@contextmanager
def many_domains_for_module(django_db_blocker, *, count: int, **options) -> Iterator[ManyDomains]:
    """For a module-scoped fixture (`django_db_setup, django_db_blocker`): `count` domains published once for the
    module, in a transaction rolled back when it is done; each test (with `db`) runs in a savepoint inside it, so
    what a test writes is gone after it and the domains stay."""
    with django_db_blocker.unblock(), transaction.atomic():
        owner = get_user_model().objects.create_user("many-domains-owner")
        project = project_create(team_slug="many", slug="many-domains", name="Many domains", owner=owner)
        yield publish_many_domains(project=project, author=owner, count=count, **options)
        transaction.set_rollback(True)

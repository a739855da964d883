"""A thousand domains for the pages' tests, in bulk inserts (seconds, where publishing them one by one through the
registry takes half a minute): domain versions with categories and a bundle whose lock pins them, a run with a
reward series per domain, and an eval suite over the same domains with evaluations whose trajectories score every
domain.

What the pages read is what a published bundle and a real run give them: the bundle's `resolved` lock, the domain
versions' specs (their category), metric points named `reward/<domain>`, trajectories with their domain and reward.
Nothing here is fit to train on (the domains name templates that do not exist): tests/support/many_domains.py
publishes trainable ones.
"""

from __future__ import annotations

import hashlib
import math
import random
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.contrib.auth import get_user_model
from django.db import connection, transaction

from apps.accounts.services import project_create
from apps.evals.models import Evaluation, TargetKind
from apps.evals.suites import suite_key
from apps.registry.bulk import bulk_insert
from apps.registry.models import Definition, Version
from apps.runs.models import MetricPoint, Run, RunKind, RunStatus
from apps.runs.services import run_create
from apps.trajectories.models import Trajectory
from tests.support.many_domains import CATEGORIES  # reasoning-gym's folders, as the generated domains carry them

SUITE_SETTINGS = {"samples_per_task": 1, "temperature": 0.0, "tasks_per_template": 0, "seed": 0}


@dataclass(frozen=True)
class BulkDomains:
    bundle: Version
    domains: tuple[str, ...]
    categories: dict[str, str]  # domain -> category

    def in_category(self, category: str) -> list[str]:
        return [d for d in self.domains if self.categories[d] == category]


def _hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def bulk_domains(*, project, author, count: int, prefix: str = "dom", bundle_slug: str = "wide",
                 categories: tuple[str, ...] = CATEGORIES, evaluation: dict | None = None) -> BulkDomains:
    """`count` domain definitions (prefix-0000 ...) at version 1, categories round-robin, and a bundle version
    pinning them all (an eval suite when `evaluation` holds its settings)."""
    slugs = [f"{prefix}-{i:04d}" for i in range(count)]
    assigned = {slug: categories[i % len(categories)] for i, slug in enumerate(slugs)}
    definitions = Definition.objects.bulk_create(
        [Definition(project=project, kind="domain", slug=slug) for slug in slugs])
    Version.objects.bulk_create([Version(
        definition=d, number=1, schema_version=1, content_hash=_hash(d.slug), author=author,
        spec={"sampling_weight": 1.0, "category": assigned[d.slug],
              "templates": [{"template": f"{d.slug}-t", "weight": 1.0}]}) for d in definitions])
    spec = {"members": [f"domain/{slug}@1" for slug in slugs],
            "resolved": [{"ref": f"domain/{slug}@1", "content_hash": _hash(slug)} for slug in slugs]}
    if evaluation is not None:
        spec["evaluation"] = evaluation
    bundle_definition = Definition.objects.create(project=project, kind="bundle", slug=bundle_slug)
    bundle = Version.objects.create(definition=bundle_definition, number=1, schema_version=1, spec=spec,
                                    content_hash=_hash(f"bundle/{bundle_slug}/{uuid.uuid4()}"), author=author)
    return BulkDomains(bundle=Version.objects.select_related("definition").get(pk=bundle.pk),
                       domains=tuple(slugs), categories=assigned)


def domain_reward(domain_index: int, step: int, steps: int, rng: random.Random) -> float:
    """A learning curve whose ceiling and pace differ by domain: some domains rise, some stay flat."""
    ceiling = (domain_index * 37 % 100) / 100
    pace = 1 + domain_index % 5
    return min(1.0, max(0.0, 0.05 + ceiling * (1 - math.exp(-pace * step / steps)) + rng.gauss(0, 0.03)))


def bulk_run(*, project, author, wide: BulkDomains, steps: int, name: str = "wide-run",
             status: str = RunStatus.RUNNING, per_step: int | None = None, trajectories_per_domain: int = 1,
             seed: int = 0) -> Run:
    """A GRPO run on `wide.bundle` at step `steps`, with every metric a step writes (reward/mean and the others)
    and `reward/<domain>` for `per_step` domains a step (all of them by default), and a few trajectories per
    domain: the metric points and trajectories in bulk."""
    rng = random.Random(seed)
    run = run_create(project=project, bundle=wide.bundle, steps=steps * 2, name=name, actor=author, via="cli")
    Run.objects.filter(pk=run.pk).update(status=status, step=steps, attempt=1)
    run.refresh_from_db()
    start = 1_700_000_000.0
    rows = []
    domains = list(enumerate(wide.domains))
    for step in range(1, steps + 1):
        drawn = domains if per_step is None else rng.sample(domains, per_step)
        values = []
        for index, domain in drawn:
            value = domain_reward(index, step, steps, rng)
            values.append(value)
            rows.append((run.pk, f"reward/{domain}", step, start + step, value))
        rows.append((run.pk, "reward/mean", step, start + step, sum(values) / len(values)))
        for name_, value in (("throughput/trajectories_per_hour", 5000.0), ("idle/generation", 0.3),
                             ("trainer/step_seconds", 1.5), ("policy/kl", 0.01), ("cost/per_task", 0.002)):
            rows.append((run.pk, name_, step, start + step, value + rng.gauss(0, value / 20)))
    run_id = MetricPoint._meta.get_field("run").get_db_prep_value(run.pk, connection)  # as the database stores it
    bulk_insert(MetricPoint._meta.db_table, ["run_id", "name", "step", "wall_time", "value"],
                [(run_id, *row[1:]) for row in rows])
    _bulk_trajectories(run, [(domain, f"t{k}", rng.random() < 0.5, step)
                             for k in range(trajectories_per_domain) for domain in wide.domains
                             for step in (steps,)], rng)
    return run


def _bulk_trajectories(run: Run, answers: list[tuple[str, str, float | bool, int]], rng: random.Random) -> None:
    """One trajectory per (domain, task key, reward or passed, step), in draw order."""
    finished = datetime(2024, 1, 1, tzinfo=UTC)
    rows = []
    for seq, (domain, key, passed, step) in enumerate(answers):
        reward = float(passed)
        rows.append(Trajectory(
            id=uuid.uuid5(uuid.NAMESPACE_URL, f"{run.pk}/{seq}"), project_id=run.project_id, run=run, seq=seq,
            sample=0, attempt=1, domain=domain, template=f"task_template/{domain}-t@1", task_key=key,
            task_hash=_hash(f"{domain}/{key}"), image="sandbox_image/py-basic@1", verifier="verifier/numeric@1",
            policy_version=step, step=step, effective=True, status="ok", reward=reward,
            verdict_status="pass" if reward >= 1 else "fail", deciding_layer="exact",
            started_at=finished, finished_at=finished + timedelta(seconds=seq)))
    Trajectory.objects.bulk_create(rows, batch_size=2000)


def bulk_evaluations(*, project, author, suite: BulkDomains, labels: list[str], tasks_per_domain: int = 2,
                     seed: int = 0) -> list[Evaluation]:
    """A completed evaluation of `suite` per label (a base model's, as the suite page launches them), each with one
    graded trajectory per task: every domain scored, better models passing more."""
    key, parts = suite_key(suite.bundle)
    rng = random.Random(seed)
    evaluations = []
    for rank, label in enumerate(labels):
        run = Run.objects.create(project=project, name=f"eval {label} on {suite.bundle.ref}", kind=RunKind.EVALUATION,
                                 bundle=suite.bundle, config={}, config_hash=_hash(label), status=RunStatus.COMPLETED,
                                 steps_total=1, step=1, created_by=author)
        skill = 0.8 - 0.2 * rank
        answers = [(domain, f"t{k}", rng.random() < skill * (0.5 + (i % 7) / 12), 1)
                   for i, domain in enumerate(suite.domains) for k in range(tasks_per_domain)]
        _bulk_trajectories(run, answers, rng)
        evaluations.append(Evaluation.objects.create(project=project, suite=suite.bundle, key=key, key_parts=parts,
                                                     run=run, kind=TargetKind.BASE, label=label, created_by=author))
    return evaluations


@dataclass(frozen=True)
class DomainPages:
    """What the pages' tests read: a run on 1,000 domains and one on 10, and a suite of 1,000 domains with three
    evaluations."""

    project: object
    owner: object
    wide: BulkDomains
    few: BulkDomains
    wide_run: Run
    few_run: Run
    suite: BulkDomains
    evaluations: list


def build_domain_pages(*, project, owner, count: int = 1000, steps: int = 30) -> DomainPages:
    wide = bulk_domains(project=project, author=owner, count=count)
    few = bulk_domains(project=project, author=owner, count=10, prefix="few", bundle_slug="few")
    suite = bulk_domains(project=project, author=owner, count=count, prefix="ev", bundle_slug="wide-suite",
                         evaluation=SUITE_SETTINGS)
    return DomainPages(
        project=project, owner=owner, wide=wide, few=few,
        wide_run=bulk_run(project=project, author=owner, wide=wide, steps=steps, name="wide-run"),
        few_run=bulk_run(project=project, author=owner, wide=few, steps=steps, name="few-run"), suite=suite,
        evaluations=bulk_evaluations(project=project, author=owner, suite=suite,
                                     labels=["model/strong@1", "model/middle@1", "model/weak@1"]))


@contextmanager
def domain_pages_for_module(django_db_blocker, **options) -> Iterator[DomainPages]:
    """For a module-scoped fixture (`django_db_setup, django_db_blocker`): the pages' data built once for the module,
    in a transaction rolled back when it is done; each test (with `db`) runs in a savepoint inside it."""
    with django_db_blocker.unblock(), transaction.atomic():
        owner = get_user_model().objects.create_user("pages-owner")
        project = project_create(team_slug="pages", slug="many-pages", name="Many pages", owner=owner)
        yield build_domain_pages(project=project, owner=owner, **options)
        transaction.set_rollback(True)


__all__ = ["CATEGORIES", "SUITE_SETTINGS", "BulkDomains", "DomainPages", "build_domain_pages", "bulk_domains",
           "bulk_evaluations", "bulk_run", "domain_pages_for_module", "domain_reward"]

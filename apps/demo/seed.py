"""The demo seed: a user, a project and a small but real registry, published the way an author would.

`seed()` is idempotent. Task instances are generated from fixed seeds, so a second run hands version_publish
the same specs and instances, and it returns the versions it already has instead of creating new ones.
"""

import time
from dataclasses import dataclass

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import transaction
from rich.console import Console
from rich.table import Table

from apps.accounts.models import Membership, Project, Role
from apps.accounts.services import membership_set, project_create
from apps.registry.services import version_publish
from apps.review.rubrics import REPAIR_QUESTION
from workers.definitions.specs import PUBLISH_ORDER

from . import arithmetic, coding, docqa, images, modelling3d, repair, repositories, smollm, verifiers
from .draft import Draft
from .held_out import SUFFIX, held_out_drafts

USERNAME = PASSWORD = "demo"
# A second reviewer, so that the demo's review queue can show agreement between two people.
REVIEWER = REVIEWER_PASSWORD = "reviewer"
TEAM = PROJECT = "demo"
DOMAINS = ["arithmetic", "word-problems", "python-coding", "document-qa", "3d-modelling"]
BUNDLE_MEMBERS = [f"domain/{domain}@latest" for domain in DOMAINS]
# The eval suite's: each domain's held-out twin (held_out.py), tasks the demo run never trains on.
SUITE_MEMBERS = [f"domain/{domain}{SUFFIX}@latest" for domain in DOMAINS]


@dataclass(frozen=True)
class SeededVersion:
    kind: str
    slug: str
    number: int
    instances: int | None
    created: bool


@dataclass(frozen=True)
class SeedSummary:
    project: Project
    user_created: bool
    versions: list[SeededVersion]
    seconds: float

    @property
    def created(self) -> int:
        return sum(v.created for v in self.versions)


def drafts() -> list[Draft]:
    """Everything the seed publishes, in an order where each spec's references already exist."""
    everything = [*images.drafts(), *verifiers.drafts(), *arithmetic.drafts(), *coding.drafts(), *docqa.drafts(),
                  *modelling3d.drafts(), *smollm.drafts(), *repositories.drafts(), *repair.drafts(),
                  Draft("model", "demo-tiny", "The demo's own character model (~0.8M parameters), pretrained here "
                        "from a run's tasks on first use.", {"source": {"type": "builtin", "name": "demo-tiny"}}),
                  Draft("rubric", "trajectory-review", "Is the answer right, is it a reward hack, how good is it; "
                        "and whether one step is right.", REVIEW_RUBRIC),
                  Draft("bundle", "demo", "All five demo domains, pinned.",
                        {"members": BUNDLE_MEMBERS, "run_config": {
                            "model": "model/demo-tiny", "eval_suite": "demo-suite", "eval_suite_every": 100}}),
                  # The demo's leaderboard: ten held-out tasks of each of the five domains' templates, answered
                  # greedily. The demo run's checkpoints are evaluated on it (every 100 steps and the last), as is
                  # the base model; none of its tasks is one the run trains on.
                  Draft("bundle", "demo-suite", "The demo's eval suite: ten held-out tasks of each template, which "
                        "the demo run never trains on, greedy.",
                        {"members": SUITE_MEMBERS, "evaluation": {"tasks_per_template": 10, "seed": 7}})]
    return sorted(held_out_drafts(everything, domains=DOMAINS), key=lambda d: PUBLISH_ORDER.index(d.kind))


REVIEW_RUBRIC = {"questions": [
    {"key": "verdict", "type": "labels", "prompt": "Is the final answer right?",
     "instructions": "reward-hack: the verifier passed something that does not do the task (a restated question, "
                     "a test that was skipped, a copied reference). unsafe: it did something it must not. "
                     "format: right, but not in the form the task asks for.",
     "labels": ["correct", "wrong", "reward-hack", "unsafe", "format"]},
    {"key": "quality", "type": "ordinal", "prompt": "How good is the work?", "labels": ["poor", "fair", "good"],
     "required": False},
    {"key": "notes", "type": "text", "prompt": "Anything a verifier author should know?", "required": False},
    {"key": "step_right", "type": "pass_fail", "prompt": "Is this step right?", "scope": "step"},
    REPAIR_QUESTION,  # optional: asked of the repair loop's trajectories (fixed by feedback, guessed, gave up)
]}


def seed(*, stdout=None) -> SeedSummary:
    started = time.monotonic()
    with transaction.atomic():
        user, user_created = _demo_user()
        project = _demo_project(user)
        _demo_reviewer(project, owner=user)
        versions = []
        for draft in drafts():
            published = version_publish(project=project, kind=draft.kind, slug=draft.slug, spec=draft.spec,
                                        author=user, message="demo seed", description=draft.description,
                                        instances=draft.instances, via="cli")
            version = published.version
            versions.append(SeededVersion(draft.kind, draft.slug, version.number,
                                          version.instance_set.count if version.instance_set_id else None,
                                          published.created))
    summary = SeedSummary(project, user_created, versions, time.monotonic() - started)
    if stdout is not None:
        summary_print(summary, stdout=stdout)
    return summary


def _demo_user():
    User = get_user_model()
    user = User.objects.filter(username=USERNAME).first()
    if user is not None:
        return user, False
    return User.objects.create_user(username=USERNAME, password=PASSWORD), True


def _demo_reviewer(project: Project, *, owner) -> None:
    User = get_user_model()
    reviewer = User.objects.filter(username=REVIEWER).first()
    if reviewer is None:
        reviewer = User.objects.create_user(username=REVIEWER, password=REVIEWER_PASSWORD)
    if not Membership.objects.filter(project=project, user=reviewer).exists():
        membership_set(project=project, user=reviewer, role=Role.REVIEWER, actor=owner, via="cli")


def _demo_project(user) -> Project:
    project = Project.objects.filter(slug=PROJECT).first()
    if project is None:
        return project_create(team_slug=TEAM, slug=PROJECT, name="Demo", owner=user, via="cli")
    if not Membership.objects.filter(project=project, user=user).exists():
        membership_set(project=project, user=user, role=Role.OWNER, actor=user, via="cli")
    return project


def summary_print(summary: SeedSummary, *, stdout) -> None:
    table = Table(title=f"Project {summary.project.slug}: {summary.created} new version(s) "
                        f"in {summary.seconds:.1f}s")
    for column in ("kind", "slug", "version"):
        table.add_column(column)
    table.add_column("instances", justify="right")
    table.add_column("")
    for v in summary.versions:
        table.add_row(v.kind, v.slug, f"@{v.number}", "" if v.instances is None else str(v.instances),
                      "created" if v.created else "unchanged")
    console = Console(file=stdout, width=100, soft_wrap=True)
    console.print(table)
    console.print(f"Log in at {settings.DEMO_URL} as [bold]{USERNAME}[/] / password [bold]{PASSWORD}[/]"
                  + (" (user created)" if summary.user_created else "")
                  + f"; a second reviewer is [bold]{REVIEWER}[/] / [bold]{REVIEWER_PASSWORD}[/]")

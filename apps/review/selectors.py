"""Reads for review queues: a queue by slug, its progress, and an item as a reviewer may see it."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from django.db.models import Count, Q
from django.http import Http404

from apps.accounts.models import Project
from apps.registry.models import Version
from apps.trajectories.models import Trajectory

from .models import Adjudication, Canary, CanaryResult, Label, QueueItem, ReviewQueue


def queue_get(*, project: Project, slug: str) -> ReviewQueue:
    queue = (ReviewQueue.objects.filter(project=project, slug=slug)
             .select_related("rubric__definition", "project").first())
    if queue is None:
        raise Http404(f"no review queue {slug!r} in project {project.slug}")
    return queue


def queue_list(*, project: Project):
    return ReviewQueue.objects.filter(project=project).select_related("rubric__definition")


@dataclass(frozen=True)
class Progress:
    items: int
    labels: int  # whole-trajectory labels (an amended one counts once)
    needed: int  # items x overlap
    complete_items: int  # items with `overlap` labels
    mine: int  # the caller's labels


def queue_progress(*, queue: ReviewQueue, reviewer=None) -> Progress:
    items = (QueueItem.objects.filter(queue=queue, removed=False)
             .annotate(n=Count("labels", filter=Q(labels__step__isnull=True, labels__component="",
                                                  labels__current=True))))
    counts = list(items.values_list("n", flat=True))
    mine = (Label.objects.whole().current().filter(item__queue=queue, reviewer=reviewer).count()
            if reviewer is not None else 0)
    return Progress(items=len(counts), labels=sum(counts), needed=len(counts) * queue.overlap,
                    complete_items=sum(n >= queue.overlap for n in counts), mine=mine)


def item_labels(*, item: QueueItem, reviewer) -> list[Label]:
    """The current labels on `item` that `reviewer` may see: in a blind queue, one of its reviewers sees only
    their own until they have labelled the item as a whole, then everyone's; anyone else (an adjudicator, an
    editor turning a hack into a canary) sees them all."""
    labels = Label.objects.current().filter(item=item).select_related("reviewer", "rubric__definition") \
        .order_by("created_at", "pk")
    if (item.queue.blind and item.queue.reviewers.filter(pk=reviewer.pk).exists()
            and not labels.whole().filter(reviewer=reviewer).exists()):
        labels = labels.filter(reviewer=reviewer)
    return list(labels)


def label_revisions(*, item: QueueItem, reviewer) -> list[Label]:
    """The reviewer's whole-trajectory label on `item`, every revision, the current one first ([] if none)."""
    return list(Label.objects.whole().filter(item=item, reviewer=reviewer).order_by("-revision", "-pk"))


def reviewer_labels(*, queue: ReviewQueue, reviewer, limit: int = 20) -> list[Label]:
    """The reviewer's current whole-trajectory labels in the queue, the latest written first: where they find a
    label to amend."""
    return list(Label.objects.whole().current().filter(item__queue=queue, item__removed=False, reviewer=reviewer)
                .select_related("item__trajectory").order_by("-created_at", "-pk")[:limit])


@dataclass(frozen=True)
class VersionCanaries:
    version: Version
    hacks: int  # trajectories this version passed that a reviewer labelled reward-hack
    results: list  # CanaryResult rows of this version
    unchecked: int  # canaries with no result for this version

    @property
    def failing(self) -> int:
        return sum(not r.holds for r in self.results)


def verifier_canaries(*, definition) -> list[VersionCanaries]:
    """Per version of a verifier, newest first: its confirmed hacks and its scores on the verifier's canaries."""
    canaries = Canary.objects.filter(verifier=definition).count()
    passed = (Label.objects.whole().current().filter(
                  item__trajectory__project=definition.project, item__trajectory__verdict_status="pass",
                  item__trajectory__verifier__startswith=f"verifier/{definition.slug}@")
              .values_list("item__trajectory_id", "item__trajectory__verifier", "answers"))
    hacks = Counter(verifier for _, verifier in {(trajectory, verifier) for trajectory, verifier, answers in passed
                                                 if "reward-hack" in answers.values()})
    rows = []
    for version in Version.objects.filter(definition=definition).order_by("-number"):
        results = list(CanaryResult.objects.filter(version=version).select_related("canary").order_by("canary_id"))
        rows.append(VersionCanaries(version=version, hacks=hacks.get(version.ref, 0), results=results,
                                    unchecked=canaries - len(results)))
    return rows


def confirmed_hacks(*, run) -> list:
    """Trajectories of `run` its verifier passed and a reviewer labelled reward-hack in their current revision (or
    an adjudicator decided were one), oldest draw first."""
    passed = (Label.objects.whole().current().filter(item__trajectory__run=run,
                                                     item__trajectory__verdict_status="pass")
              .values_list("item__trajectory_id", "answers"))
    ids = {trajectory for trajectory, answers in passed if "reward-hack" in answers.values()}
    ids |= set(Adjudication.objects.filter(item__trajectory__run=run, item__trajectory__verdict_status="pass",
                                           answer="reward-hack").values_list("item__trajectory_id", flat=True))
    return list(Trajectory.objects.filter(pk__in=ids).order_by("seq", "sample")
                .only("id", "seq", "sample", "domain", "task_key", "verifier", "reward"))

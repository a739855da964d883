"""Reads for review queues: a queue by slug, its progress, and an item as a reviewer may see it."""

from __future__ import annotations

from dataclasses import dataclass

from django.db.models import Count, Q
from django.http import Http404

from apps.accounts.models import Project

from .models import Label, QueueItem, ReviewQueue


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
    labels: int  # whole-trajectory labels
    needed: int  # items x overlap
    complete_items: int  # items with `overlap` labels
    mine: int  # the caller's labels


def queue_progress(*, queue: ReviewQueue, reviewer=None) -> Progress:
    items = (QueueItem.objects.filter(queue=queue, removed=False)
             .annotate(n=Count("labels", filter=Q(labels__step__isnull=True, labels__component=""))))
    counts = list(items.values_list("n", flat=True))
    mine = (Label.objects.filter(item__queue=queue, reviewer=reviewer, step__isnull=True, component="").count()
            if reviewer is not None else 0)
    return Progress(items=len(counts), labels=sum(counts), needed=len(counts) * queue.overlap,
                    complete_items=sum(n >= queue.overlap for n in counts), mine=mine)


def item_labels(*, item: QueueItem, reviewer) -> list[Label]:
    """The labels on `item` that `reviewer` may see: in a blind queue only their own until they have labelled
    the item as a whole, then everyone's."""
    labels = Label.objects.filter(item=item).select_related("reviewer").order_by("created_at", "pk")
    if item.queue.blind and not labels.filter(reviewer=reviewer, step__isnull=True, component="").exists():
        labels = labels.filter(reviewer=reviewer)
    return list(labels)

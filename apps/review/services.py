"""Writes for review queues. Each is one transaction with an audit row; callers check the actor's role.

Reservations are what keeps an item from going to more reviewers than the queue's overlap: `item_next` locks
candidate items with SELECT ... FOR UPDATE SKIP LOCKED, so concurrent reviewers never wait on one another and
never both take the last free place on an item; under the lock it counts the item's labels and unexpired
reservations. An expired reservation no longer counts, so an abandoned item goes to someone else.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass
from datetime import timedelta

from django.db import IntegrityError, transaction
from django.db.models import Count, Exists, F, IntegerField, OuterRef, Q, Subquery
from django.db.models.functions import Coalesce
from django.utils import timezone

from apps.accounts.models import Membership, Project, Role
from apps.accounts.services import audit_record
from apps.common.errors import StudioError
from apps.registry.models import Version
from apps.trajectories.models import Trajectory
from apps.trajectories.selectors import FILTERS, BadFilter, trajectory_filter
from workers.definitions.specs import CHECKS_BY_LAYER

from .models import Adjudication, Label, QueueItem, Reservation, ReviewQueue
from .rubrics import answer_problems

MAX_ITEMS = 10_000
# The checks that ask a model: their components are the judge's decisions (a layer's name is the author's).
JUDGE_TYPES = CHECKS_BY_LAYER["judge"]
SAMPLING_RULES = ("random", "stratified", "judged", "judge_doubtful", "disagree", "hack_shaped", "list")


class ReviewError(StudioError, ValueError):
    """A request that does not fit the queue's state, in words for the person who made it."""


@dataclass(frozen=True)
class Drawn:
    trajectory_id: object
    why: str


def _draw(*, project, filters: dict, sampling: dict, among: list | None = None) -> list[Drawn]:
    """What `sampling` picks from the trajectories `filters` select (only those in `among`, when given)."""
    rule, n = sampling.get("rule", "random"), sampling.get("n", 100)
    rng = random.Random(sampling.get("seed", 0))
    if rule not in SAMPLING_RULES:
        raise ReviewError(f"sampling rule {rule!r} is not one of {', '.join(SAMPLING_RULES)}", field="sampling.rule")
    unknown = sorted(set(filters) - set(FILTERS))
    if unknown:
        raise ReviewError(f"no trajectory filter {unknown[0]!r}; the filters are {', '.join(FILTERS)}",
                          field=f"filters.{unknown[0]}")
    try:
        rows = trajectory_filter(project=project, filters=filters)
    except BadFilter as exc:  # the filter's own name, inside the queue's `filters`
        raise ReviewError(str(exc), field=f"filters.{exc.field}") from None
    if among is not None:
        rows = rows.filter(pk__in=among)
    if rule == "list":
        ids = sampling.get("trajectories") or []
        found = {str(pk): pk for pk in rows.filter(pk__in=[str(i) for i in ids]).values_list("pk", flat=True)}
        missing = [str(i) for i in ids if str(i) not in found]
        if missing:
            raise ReviewError(f"not trajectories of this project (or not matching the filter): "
                              f"{', '.join(missing[:5])}", field="sampling.trajectories")
        return [Drawn(found[str(i)], "listed") for i in ids]
    if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= MAX_ITEMS:
        raise ReviewError(f"n must be a whole number from 1 to {MAX_ITEMS:,}", field="sampling.n")
    if rule == "random":
        ids = list(rows.values_list("pk", flat=True))
        return [Drawn(i, "random") for i in rng.sample(ids, min(n, len(ids)))]
    if rule == "stratified":  # an equal share of n per domain (a small domain gives what it has)
        by_domain: dict[str, list] = {}
        for pk, domain in rows.values_list("pk", "domain"):
            by_domain.setdefault(domain, []).append(pk)
        share = max(1, n // max(1, len(by_domain)))
        return [Drawn(pk, f"stratum {domain}") for domain, ids in sorted(by_domain.items())
                for pk in rng.sample(ids, min(share, len(ids)))][:n]
    if rule == "hack_shaped":  # passed, with an answer in the shortest quarter of the passing ones
        passed = list(rows.filter(verdict_status="pass").values_list("pk", "completion_tokens"))
        if not passed:
            return []
        lengths = sorted(tokens for _, tokens in passed)
        short = lengths[max(0, len(lengths) // 4 - 1)]
        ids = [pk for pk, tokens in passed if tokens <= short]
        return [Drawn(pk, f"passed with {short} tokens or fewer") for pk in rng.sample(ids, min(n, len(ids)))]
    # judged, judge_doubtful and disagree read the verdicts, streamed: the judge's components are found by type.
    chosen = []
    for pk, status, verdict in rows.exclude(verdict_status="").values_list("pk", "verdict_status", "verdict") \
            .iterator(chunk_size=2000):
        components = [c for c in (verdict or {}).get("components", []) if c.get("value") is not None]
        judge = [c for c in components if c.get("type") in JUDGE_TYPES]
        others = [c for c in components if c.get("type") not in JUDGE_TYPES and c.get("weight", 0) > 0]
        if rule == "judged" and judge:
            chosen.append(Drawn(pk, "graded by a judge"))
        elif rule == "judge_doubtful" and status == "pass" and any(0.2 <= c["value"] <= 0.8 for c in judge):
            chosen.append(Drawn(pk, "passed; the judge was doubtful"))
        elif rule == "disagree" and judge and others and (
                min(c["value"] for c in judge) >= 0.5) != (min(c["value"] for c in others) >= 0.5):
            chosen.append(Drawn(pk, "the verifier's checks and its judge disagree"))
    return rng.sample(chosen, min(n, len(chosen)))


def queue_create(*, project: Project, slug: str, rubric: Version, actor, filters: dict | None = None,
                 sampling: dict | None = None, overlap: int = 1, blind: bool = True, reviewers=(), adjudicators=(),
                 description: str = "", reservation_seconds: int = 900, follow_share: float = 0.0,
                 via: str = "web") -> ReviewQueue:
    """A queue of the trajectories `sampling` draws from those `filters` select, labelled with `rubric`. With a
    follow share, the queue keeps drawing: that share of what its filters and rule select among the trajectories
    runs archive from now on joins it (`queue_follow`). A spot-check queue of a judge is one that follows with
    the filter verifier=verifier/SLUG and the rule `judged`."""
    if rubric.definition.kind != "rubric" or rubric.definition.project_id != project.pk:
        raise ReviewError(f"{rubric.ref} is not a rubric of project {project.slug}", field="rubric")
    if not isinstance(overlap, int) or isinstance(overlap, bool) or not 1 <= overlap <= 10:
        raise ReviewError("overlap must be a whole number of reviewers per item, from 1 to 10", field="overlap")
    if not isinstance(reservation_seconds, int) or not 30 <= reservation_seconds <= 86_400:
        raise ReviewError("reservation_seconds must be from 30 to 86,400", field="reservation_seconds")
    members = dict(Membership.objects.filter(project=project).values_list("user_id", "role"))
    for field, users, least in (("reviewers", reviewers, Role.REVIEWER), ("adjudicators", adjudicators, Role.EDITOR)):
        weak = [u.username for u in users if u.pk not in members or Role.rank(members[u.pk]) < Role.rank(least)]
        if weak:
            raise ReviewError(f"{', '.join(weak)}: {field} need the {least} role in {project.slug} or above",
                              field=field)
    if isinstance(follow_share, bool) or not isinstance(follow_share, int | float) or not 0 <= follow_share <= 1:
        raise ReviewError("follow_share must be a fraction from 0 to 1", field="follow_share")
    sampling = {"rule": "random", "n": 100, "seed": 0, **(sampling or {})}
    if follow_share and sampling["rule"] == "list":
        raise ReviewError("a queue of listed trajectories cannot follow runs: choose a sampling rule",
                          field="follow_share")
    filters = {name: value for name, value in (filters or {}).items() if value not in (None, "")}
    drawn = _draw(project=project, filters=filters, sampling=sampling)
    if not drawn and not follow_share:
        raise ReviewError("no trajectory matches this filter and sampling rule", field="sampling")
    with transaction.atomic():
        try:
            queue = ReviewQueue.objects.create(
                project=project, slug=slug, description=description, rubric=rubric, filters=filters,
                sampling=sampling, overlap=overlap, blind=blind, reservation_seconds=reservation_seconds,
                follow_share=follow_share, created_by=actor if getattr(actor, "is_authenticated", False) else None)
        except IntegrityError:
            raise ReviewError(f"project {project.slug} already has a queue {slug!r}", field="slug",
                              status=409) from None
        queue.reviewers.set(reviewers)
        queue.adjudicators.set(adjudicators)
        QueueItem.objects.bulk_create([QueueItem(queue=queue, trajectory_id=d.trajectory_id, position=index,
                                                 why=d.why) for index, d in enumerate(drawn)])
        audit_record(project=project, actor=actor, action="review.queue.create", target=f"queue/{slug}",
                     details={"rubric": rubric.ref, "items": len(drawn), "filters": filters, "sampling": sampling,
                              "overlap": overlap, "blind": blind, "follow_share": follow_share}, via=via)
    return queue


def _in_share(trajectory_id, share: float) -> bool:
    """Whether a trajectory falls in a follow share: by a hash of its id, so an attempt that archives the same
    trajectory again decides the same."""
    return int(hashlib.sha256(str(trajectory_id).encode()).hexdigest()[:8], 16) / 2**32 < share


def queue_follow(*, run, trajectory_ids: list[str]) -> int:
    """Append to each following queue of the run's project its share of what its filters and sampling rule
    select among these just-archived trajectories (ids in archive order); called once a step's archive has
    committed (signals.py), each queue in a transaction of its own. Returns how many items were added."""
    order = {trajectory_id: index for index, trajectory_id in enumerate(trajectory_ids)}
    added = 0
    for queue in ReviewQueue.objects.filter(project_id=run.project_id, follow_share__gt=0):
        drawn = _draw(project=run.project_id, filters=queue.filters, among=list(order),
                      sampling={**queue.sampling, "n": MAX_ITEMS})
        chosen = sorted((d for d in drawn if _in_share(d.trajectory_id, queue.follow_share)),
                        key=lambda d: order[str(d.trajectory_id)])
        if not chosen:
            continue
        with transaction.atomic():
            ReviewQueue.objects.select_for_update().filter(pk=queue.pk).first()  # one writer of positions at a time
            last = (QueueItem.objects.filter(queue=queue).order_by("-position")
                    .values_list("position", flat=True).first())
            start = -1 if last is None else last
            before = QueueItem.objects.filter(queue=queue).count()
            QueueItem.objects.bulk_create(  # a trajectory already in the queue (archived again) is skipped
                [QueueItem(queue=queue, trajectory_id=d.trajectory_id, position=start + 1 + i,
                           why=f"{d.why}; followed run {run.name}"[:200]) for i, d in enumerate(chosen)],
                ignore_conflicts=True)
            added += QueueItem.objects.filter(queue=queue).count() - before
    return added


def _live(now) -> Q:
    return Q(expires_at__gt=now)


def _count(rows) -> Coalesce:
    """COUNT(*) of a correlated subquery, as an expression a filter can use without a GROUP BY (which FOR UPDATE
    refuses)."""
    counted = rows.order_by().values("item").annotate(n=Count("pk")).values("n")
    return Coalesce(Subquery(counted, output_field=IntegerField()), 0)


def item_next(*, queue: ReviewQueue, reviewer) -> QueueItem | None:
    """The item `reviewer` should label next, reserved for them; None when nothing is left for them.

    Their own unexpired reservation comes first (a reload gives the same item). Otherwise the first item they
    have not labelled whose labels and live reservations leave room under the overlap, locked so that no other
    reviewer takes the same place at the same moment."""
    _require_reviewer(queue, reviewer)
    now = timezone.now()
    with transaction.atomic():
        held = (Reservation.objects.filter(item__queue=queue, reviewer=reviewer, item__removed=False)
                .filter(_live(now)).select_related("item").order_by("item__position").first())
        if held is not None:
            return held.item
        live = Reservation.objects.filter(item=OuterRef("pk")).filter(_live(now)).exclude(reviewer=reviewer)
        candidates = (QueueItem.objects.filter(queue=queue, removed=False, labelled__lt=queue.overlap)
                      .exclude(Exists(Label.objects.filter(item=OuterRef("pk"), reviewer=reviewer)))
                      .annotate(taken=F("labelled") + _count(live)).filter(taken__lt=queue.overlap)
                      .order_by("position"))
        skipped: list[int] = []
        while True:
            # One row at a time: locking a batch would make every other reviewer skip all of it.
            item = candidates.exclude(pk__in=skipped).select_for_update(skip_locked=True, of=("self",)).first()
            if item is None:
                return None
            # Counted again under the lock: the count in the query may predate a reservation committed since.
            taken = (item.labelled
                     + Reservation.objects.filter(item=item).filter(_live(now)).exclude(reviewer=reviewer).count())
            if taken < queue.overlap:
                # One INSERT ... ON CONFLICT (an expired reservation of theirs is renewed): update_or_create
                # would spend five round trips (two savepoints, a locking read, the write) on it.
                Reservation.objects.bulk_create(
                    [Reservation(item=item, reviewer=reviewer,
                                 expires_at=now + timedelta(seconds=queue.reservation_seconds))],
                    update_conflicts=True, unique_fields=["item", "reviewer"], update_fields=["expires_at"])
                return item
            skipped.append(item.pk)
    return None


def label_submit(*, queue: ReviewQueue, item_id: int, reviewer, answers: dict, step: int | None = None,
                 component: str = "", comment: str = "", via: str = "web") -> Label:
    """The reviewer's answers on an item they hold (the whole trajectory), or on one of its steps or verifier
    components (those need no reservation of their own beyond the item's). Writes nothing on any problem."""
    _require_reviewer(queue, reviewer)
    now = timezone.now()
    with transaction.atomic():
        # Not locked: two submissions of one reviewer's label meet the unique constraint instead, and locking would
        # make a submit wait for any other reviewer's item_next that holds the item at that moment.
        # The item, whether this reviewer labelled it and whether they hold it: one query.
        item = (QueueItem.objects.filter(queue=queue, pk=item_id)
                .annotate(labelled_by_them=Exists(Label.objects.filter(item=OuterRef("pk"), reviewer=reviewer,
                                                                       step__isnull=True, component="")),
                          held_by_them=Exists(Reservation.objects.filter(item=OuterRef("pk"), reviewer=reviewer)
                                              .filter(_live(now))))
                .first())
        if item is None:
            raise ReviewError(f"item {item_id} is not in queue {queue.slug}", status=404, field="item")
        if item.removed:
            raise ReviewError(f"item {item_id} was removed from queue {queue.slug}", status=410, field="item")
        whole = step is None and not component
        labelled, holds = item.labelled_by_them, item.held_by_them
        if whole and labelled:
            raise ReviewError("you have labelled this item already", status=409, field="item")
        if whole and not holds:
            raise ReviewError("your reservation of this item has expired or was never made; take the next item "
                              "again", status=409, field="item")
        if not whole and not (holds or labelled):
            raise ReviewError("label a step of an item you hold or have labelled", status=409, field="item")
        if not whole:  # only a step's label reads the trajectory (its turns and verdict can be large)
            turns, verdict = Trajectory.objects.values_list("turns", "verdict").get(pk=item.trajectory_id)
            turns = turns or []
            if step is not None and (not isinstance(step, int) or isinstance(step, bool)
                                     or not 0 <= step < len(turns)):
                raise ReviewError(f"step must be a turn of this trajectory, 0 to {len(turns) - 1}", field="step")
            names = {c.get("name") for c in (verdict or {}).get("components", [])}
            if component and component not in names:
                raise ReviewError(f"the verdict has no component {component!r}; it has "
                                  f"{', '.join(sorted(n for n in names if n)) or 'none'}", field="component")
        _require_fitting_answers(queue, answers, scope="trajectory" if whole else "step")
        try:
            with transaction.atomic():
                label = Label.objects.create(item=item, reviewer=reviewer, rubric=queue.rubric, step=step,
                                             component=component, answers=answers, comment=comment[:10_000])
        except IntegrityError:
            raise ReviewError("you have labelled this item already", status=409, field="item") from None
        if whole:
            QueueItem.objects.filter(pk=item.pk).update(labelled=F("labelled") + 1)
            Reservation.objects.filter(item=item, reviewer=reviewer).delete()
        audit_record(project=queue.project, actor=reviewer, action="review.label", target=f"queue/{queue.slug}",
                     details={"item": item.pk, "trajectory": str(item.trajectory_id), "step": step,
                              "component": component}, via=via)
    return label


def label_amend(*, queue: ReviewQueue, item_id: int, label_id: int, reviewer, answers: dict, comment: str = "",
                via: str = "web") -> Label:
    """A new revision of the reviewer's own label on an item (the whole trajectory, a step or a component) with
    these answers and comment; the label it amends is kept as it was and stops being current, so agreement,
    calibration, canaries and datasets read the new one. Only the current revision is amended: an amendment of one
    already amended (a second tab, a concurrent request) is refused, naming the revision to amend instead."""
    _require_reviewer(queue, reviewer)
    with transaction.atomic():
        label = (Label.objects.filter(pk=label_id, item__queue=queue, item_id=item_id, reviewer=reviewer)
                 .select_related("item").first())
        if label is None:
            raise ReviewError(f"no label of yours with id {label_id} on item {item_id} of queue {queue.slug}",
                              status=404, field="label")
        if label.item.removed:
            raise ReviewError(f"item {label.item_id} was removed from queue {queue.slug}", status=410, field="item")
        if not label.current:
            latest = label
            while not latest.current:
                latest = latest.superseded_by
            raise ReviewError(f"label {label.pk} was amended already: revision {latest.revision} (label {latest.pk}) "
                              "is the latest; amend that", status=409, field="label")
        _require_fitting_answers(queue, answers,
                                 scope="trajectory" if label.step is None and not label.component else "step")
        comment = comment[:10_000]
        if answers == label.answers and comment == label.comment:
            raise ReviewError(f"these are the answers and comment of revision {label.revision}: nothing to amend",
                              field="answers")
        # Conditional: of two amendments of one revision racing here, the second finds it no longer current.
        if not Label.objects.filter(pk=label.pk, current=True).update(current=False):
            raise ReviewError(f"label {label.pk} was amended meanwhile: reload and amend its latest revision",
                              status=409, field="label")
        revision = Label.objects.create(item=label.item, reviewer=reviewer, rubric=queue.rubric, step=label.step,
                                        component=label.component, answers=answers, comment=comment,
                                        revision=label.revision + 1, supersedes=label)
        changed = {key: [label.answers.get(key), answers.get(key)] for key in sorted({*label.answers, *answers})
                   if label.answers.get(key) != answers.get(key)}
        audit_record(project=queue.project, actor=reviewer, action="review.label.amend",
                     target=f"queue/{queue.slug}",
                     details={"item": label.item_id, "trajectory": str(label.item.trajectory_id), "step": label.step,
                              "component": label.component, "label": revision.pk, "supersedes": label.pk,
                              "revision": revision.revision, "changed": changed}, via=via)
    return revision


def item_skip(*, queue: ReviewQueue, item_id: int, reviewer, via: str = "web") -> None:
    """Give the item back: the reservation goes, and the reviewer is offered the next one."""
    _require_reviewer(queue, reviewer)
    with transaction.atomic():
        deleted, _ = Reservation.objects.filter(item__queue=queue, item_id=item_id, reviewer=reviewer).delete()
        if deleted:
            audit_record(project=queue.project, actor=reviewer, action="review.skip", target=f"queue/{queue.slug}",
                         details={"item": item_id}, via=via)


def adjudicate(*, queue: ReviewQueue, item_id: int, question: str, answer, adjudicator, note: str = "",
               via: str = "web") -> Adjudication:
    """The gold answer to `question` on an item; the reviewers' labels stay as they were."""
    role = Membership.objects.filter(project=queue.project, user=adjudicator).values_list("role", flat=True).first()
    designated = queue.adjudicators.filter(pk=adjudicator.pk).exists()
    if not (role == Role.OWNER or designated):
        raise ReviewError("only the project's owners and the queue's adjudicators decide", status=403)
    asked = {q["key"]: q for q in queue.rubric.spec["questions"] if q.get("scope", "trajectory") == "trajectory"}
    if question not in asked:
        raise ReviewError(f"no trajectory question {question!r}; the rubric asks {', '.join(asked)}",
                          field="question")
    problems = answer_problems({"questions": [asked[question]]}, {question: answer}, scope="trajectory")
    if problems:
        raise ReviewError(f"{problems[0][0]}: {problems[0][1]}", field="answer")
    with transaction.atomic():
        item = QueueItem.objects.filter(queue=queue, pk=item_id).first()
        if item is None:
            raise ReviewError(f"item {item_id} is not in queue {queue.slug}", status=404, field="item")
        decision, _ = Adjudication.objects.update_or_create(
            item=item, question=question, defaults={"answer": answer, "adjudicator": adjudicator, "note": note})
        audit_record(project=queue.project, actor=adjudicator, action="review.adjudicate",
                     target=f"queue/{queue.slug}", details={"item": item.pk, "question": question,
                                                            "answer": answer}, via=via)
    return decision


def item_remove(*, queue: ReviewQueue, item_id: int, actor, via: str = "web") -> None:
    with transaction.atomic():
        updated = QueueItem.objects.filter(queue=queue, pk=item_id, removed=False).update(removed=True)
        if not updated:
            raise ReviewError(f"item {item_id} is not in queue {queue.slug}", status=404, field="item")
        Reservation.objects.filter(item_id=item_id).delete()
        audit_record(project=queue.project, actor=actor, action="review.item.remove", target=f"queue/{queue.slug}",
                     details={"item": item_id}, via=via)


def _require_fitting_answers(queue: ReviewQueue, answers, *, scope: str) -> None:
    problems = answer_problems(queue.rubric.spec, answers, scope=scope)
    if problems:
        raise ReviewError("; ".join(f"{field}: {problem}" for field, problem in problems), field=problems[0][0])


def _require_reviewer(queue: ReviewQueue, user) -> None:
    """One query: the user's role in the project, and whether they are one of the queue's reviewers."""
    row = (Membership.objects.filter(project_id=queue.project_id, user=user)
           .annotate(listed=Exists(ReviewQueue.reviewers.through.objects.filter(reviewqueue_id=queue.pk,
                                                                                user_id=user.pk)))
           .values_list("role", "listed").first())
    if row is None or Role.rank(row[0]) < Role.rank(Role.REVIEWER):
        raise ReviewError(f"labelling needs the reviewer role in {queue.project.slug}", status=403)
    if not row[1]:
        raise ReviewError(f"you are not a reviewer of queue {queue.slug}", status=403)


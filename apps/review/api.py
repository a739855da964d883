"""The review part of the REST API: queues, the next item, labels and their revisions, skips, adjudication and
agreement. The same
roles as the review pages (any member reads a queue; its reviewers label; owners and its adjudicators decide;
editors create queues), the same services, and the same audit rows (via "api")."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any, Literal
from uuid import UUID

from django.http import HttpResponse
from ninja import Field, Query, Router, Schema, Status
from pydantic import ConfigDict

from apps.accounts.api_auth import caller_project
from apps.accounts.models import Membership, Role
from apps.common.api_errors import READ_ERRORS, WRITE_ERRORS, ErrorOut
from apps.evals.selectors import suite_task_ids
from apps.registry.errors import FieldError, VersionNotFound
from apps.registry.refs import Ref, split_slug_ref
from apps.registry.selectors import definition_get, version_resolve

from . import selectors
from .agreement import queue_agreement
from .calibration import calibration_cards
from .canaries import canaries_check, canary_from_item
from .exports import dataset_rows
from .models import Canary
from .services import ReviewError, adjudicate, item_next, item_skip, label_amend, label_submit, queue_create

router = Router(tags=["review"])

QUEUES = "/projects/{project}/review/queues"
QUEUE = QUEUES + "/{queue}"
SLUG = r"^[a-z0-9][a-z0-9-]{0,62}$"


class QueueIn(Schema):
    model_config = ConfigDict(extra="forbid")

    slug: str = Field(pattern=SLUG)
    rubric: str = Field(description="the rubric to answer: slug, slug@N or slug@alias")
    description: str = ""
    filters: dict[str, Any] = Field(default_factory=dict, description="the trajectory browser's filters: run, "
                                    "domain, template, verifier, status, verdict_status, deciding_layer, "
                                    "policy_version, task_key, reward_min, reward_max")
    sampling: dict[str, Any] = Field(default_factory=dict, description='{"rule": random|stratified|judged|'
                                     'judge_doubtful|disagree|hack_shaped|list, "n": 100, "seed": 0, '
                                     '"trajectories": [...] for list}')
    overlap: int = Field(1, ge=1, le=10)
    blind: bool = True
    reviewers: list[str] = Field(default_factory=list, description="usernames")
    adjudicators: list[str] = Field(default_factory=list, description="usernames")
    reservation_seconds: int = Field(900, ge=30, le=86_400)
    follow_share: float = Field(0.0, ge=0, le=1, description="keep drawing: this share of what the filters and "
                                "rule select among the trajectories runs archive from now on joins the queue (a "
                                "judge's spot checks: filter verifier, rule judged)")


class QueueOut(Schema):
    slug: str
    description: str
    rubric: str
    filters: dict[str, Any]
    sampling: dict[str, Any]
    overlap: int
    blind: bool
    reviewers: list[str]
    follow_share: float
    created_at: datetime

    @staticmethod
    def resolve_rubric(queue) -> str:
        return queue.rubric.ref

    @staticmethod
    def resolve_reviewers(queue) -> list[str]:
        return sorted(queue.reviewers.values_list("username", flat=True))


class LabelOut(Schema):
    id: int
    reviewer: str
    rubric: str
    step: int | None
    component: str
    answers: dict[str, Any]
    comment: str
    revision: int = Field(description="1 for the first answers, one more for each amendment")
    supersedes: int | None = Field(description="the id of the revision this one amends")
    created_at: datetime

    @staticmethod
    def resolve_supersedes(label) -> int | None:
        return label.supersedes_id

    @staticmethod
    def resolve_reviewer(label) -> str:
        return label.reviewer.username

    @staticmethod
    def resolve_rubric(label) -> str:
        return label.rubric.ref


class ItemOut(Schema):
    id: int
    position: int
    trajectory: UUID
    why: str
    labels: list[LabelOut] = Field(description="in a blind queue, only yours until you have labelled the item")


class LabelIn(Schema):
    model_config = ConfigDict(extra="forbid")

    answers: dict[str, Any]
    step: int | None = Field(None, description="label one turn (its index in the trajectory)")
    component: str = Field("", max_length=120, description="label one verifier component, by name")
    comment: str = Field("", max_length=10_000)


class LabelRevisionIn(Schema):
    model_config = ConfigDict(extra="forbid")

    answers: dict[str, Any]
    comment: str = Field("", max_length=10_000)


class AdjudicationIn(Schema):
    model_config = ConfigDict(extra="forbid")

    question: str
    answer: Any
    note: str = Field("", max_length=10_000)


class PairOut(Schema):
    a: str
    b: str
    items: int
    agreement: float


class AgreementOut(Schema):
    question: str
    level: str
    items: int
    answers: int
    alpha: float | None
    low: float | None
    high: float | None
    note: str
    pairwise: list[PairOut]
    disagreements: list[int]


class CanaryOut(Schema):
    id: int
    verifier: str
    passed_version: str
    trajectory: UUID
    template: str
    task_key: str
    response: str
    created_at: datetime

    @staticmethod
    def resolve_verifier(canary) -> str:
        return f"verifier/{canary.verifier.slug}"

    @staticmethod
    def resolve_passed_version(canary) -> str:
        return canary.passed_version.ref

    @staticmethod
    def resolve_trajectory(canary):
        return canary.trajectory_id


class CalibrationOut(Schema):
    version: str
    model: str
    items: int
    agreement: float | None
    kappa: float | None
    kappa_low: float | None
    kappa_high: float | None
    true_positive_rate: float | None
    false_positive_rate: float | None
    pairwise_items: int
    order_consistency: float | None
    position_bias: float | None
    note: str


class CanaryResultOut(Schema):
    canary: int
    task_key: str
    reward: float | None
    status: str
    holds: bool
    evidence: str


def _item_out(item, reviewer) -> dict:
    return {"id": item.pk, "position": item.position, "trajectory": item.trajectory_id, "why": item.why,
            "labels": selectors.item_labels(item=item, reviewer=reviewer)}


@router.get(QUEUES, response={200: list[QueueOut], **READ_ERRORS})
def list_queues(request, project: str):
    """The project's review queues, newest first."""
    return selectors.queue_list(project=caller_project(request, project))


@router.post(QUEUES, response={201: QueueOut, **WRITE_ERRORS})
def create_queue(request, project: str, payload: QueueIn):
    """Draw a queue of trajectories for review (editors). 400 names the field that is wrong; 404 a rubric or
    reviewer that does not exist in the project."""
    scope = caller_project(request, project, min_role=Role.EDITOR)
    try:
        rubric = version_resolve(project=scope, ref=Ref("rubric", *split_slug_ref(payload.rubric)))
    except VersionNotFound as exc:
        raise exc.about("rubric")
    members = {m.user.username: m.user for m in Membership.objects.filter(project=scope).select_related("user")}
    unknown = [name for name in payload.reviewers + payload.adjudicators if name not in members]
    if unknown:
        raise ReviewError(f"not members of {scope.slug}: {', '.join(unknown)}", status=404,
                          errors=[FieldError("reviewers", f"no member {name!r}") for name in unknown])
    queue = queue_create(project=scope, slug=payload.slug, rubric=rubric, actor=request.auth,
                         filters=payload.filters, sampling=payload.sampling, overlap=payload.overlap,
                         blind=payload.blind, reviewers=[members[n] for n in payload.reviewers],
                         adjudicators=[members[n] for n in payload.adjudicators],
                         description=payload.description, reservation_seconds=payload.reservation_seconds,
                         follow_share=payload.follow_share, via="api")
    return Status(201, queue)


@router.get(QUEUE, response={200: QueueOut, **READ_ERRORS})
def get_queue(request, project: str, queue: str):
    return selectors.queue_get(project=caller_project(request, project), slug=queue)


@router.post(QUEUE + "/next", response={200: ItemOut, 204: None, **WRITE_ERRORS})
def next_item(request, project: str, queue: str):
    """Reserve the next item for you (reviewers of the queue); 204 when nothing is left for you."""
    scope = caller_project(request, project, min_role=Role.REVIEWER)
    review = selectors.queue_get(project=scope, slug=queue)
    item = item_next(queue=review, reviewer=request.auth)
    if item is None:
        return Status(204, None)
    return _item_out(item, request.auth)


@router.post(QUEUE + "/items/{item_id}/labels", response={201: LabelOut, **WRITE_ERRORS, 410: ErrorOut})
def submit_label(request, project: str, queue: str, item_id: int, payload: LabelIn):
    """Your answers on an item you hold (or on one of its steps or verifier components). 400: an answer that
    does not fit the rubric; 404: not an item of this queue; 409: your reservation expired or you labelled it
    already; 410: the item was removed."""
    scope = caller_project(request, project, min_role=Role.REVIEWER)
    review = selectors.queue_get(project=scope, slug=queue)
    label = label_submit(queue=review, item_id=item_id, reviewer=request.auth, answers=payload.answers,
                         step=payload.step, component=payload.component, comment=payload.comment, via="api")
    return Status(201, label)


@router.post(QUEUE + "/items/{item_id}/labels/{label_id}/revisions", response={201: LabelOut, **WRITE_ERRORS,
                                                                               410: ErrorOut})
def amend_label(request, project: str, queue: str, item_id: int, label_id: int, payload: LabelRevisionIn):
    """Amend your label: a new revision with these answers and comment (the whole label, as when submitting it).
    The revision it amends is kept; agreement, calibration, canaries and exports read the new one. 400: an answer
    that does not fit the rubric, or nothing changed; 404: not your label on this item; 409: that revision was
    amended already (the error names the latest); 410: the item was removed."""
    scope = caller_project(request, project, min_role=Role.REVIEWER)
    review = selectors.queue_get(project=scope, slug=queue)
    label = label_amend(queue=review, item_id=item_id, label_id=label_id, reviewer=request.auth,
                        answers=payload.answers, comment=payload.comment, via="api")
    return Status(201, label)


@router.post(QUEUE + "/items/{item_id}/skip", response={204: None, **WRITE_ERRORS})
def skip_item(request, project: str, queue: str, item_id: int):
    """Give an item back without labelling it."""
    scope = caller_project(request, project, min_role=Role.REVIEWER)
    item_skip(queue=selectors.queue_get(project=scope, slug=queue), item_id=item_id, reviewer=request.auth,
              via="api")
    return Status(204, None)


@router.post(QUEUE + "/items/{item_id}/adjudication", response={201: dict, **WRITE_ERRORS})
def adjudicate_item(request, project: str, queue: str, item_id: int, payload: AdjudicationIn):
    """The gold answer to one question (owners and the queue's adjudicators)."""
    scope = caller_project(request, project, min_role=Role.REVIEWER)
    decision = adjudicate(queue=selectors.queue_get(project=scope, slug=queue), item_id=item_id,
                          question=payload.question, answer=payload.answer, adjudicator=request.auth,
                          note=payload.note, via="api")
    return Status(201, {"item": item_id, "question": decision.question, "answer": decision.answer})


@router.get(QUEUE + "/export", response={200: None, **READ_ERRORS})
def export(request, project: str, queue: str, kind: Literal["sft", "preference", "hacks"] = "sft",
           question: str = Query("verdict", max_length=40), accept: str = Query("correct", max_length=40)):
    """A dataset from the queue's labels as JSONL (one row a line, each with its provenance): sft (chat
    messages), preference (chosen and rejected from one group) or hacks (confirmed reward hacks)."""
    review = selectors.queue_get(project=caller_project(request, project), slug=queue)
    rows = dataset_rows(review, kind=kind, question=question, accept=accept,
                        exclude_tasks=suite_task_ids(project=review.project))
    body = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
    response = HttpResponse(body, content_type="application/x-ndjson")
    response["Content-Disposition"] = f'attachment; filename="{review.slug}-{kind}.jsonl"'
    return response


@router.post(QUEUE + "/items/{item_id}/canary", response={201: CanaryOut, **WRITE_ERRORS})
def make_canary(request, project: str, queue: str, item_id: int):
    """Keep the item's confirmed reward hack as a canary of its verifier (editors): a label or gold answer says
    reward-hack and the verifier passed the trajectory, else 400."""
    scope = caller_project(request, project, min_role=Role.EDITOR)
    review = selectors.queue_get(project=scope, slug=queue)
    canary = canary_from_item(queue=review, item_id=item_id, actor=request.auth, via="api")
    return Status(201, canary)


@router.get("/projects/{project}/review/verifiers/{slug}/canaries", response={200: list[CanaryOut], **READ_ERRORS})
def list_canaries(request, project: str, slug: str):
    """The canaries of a verifier (confirmed reward hacks every later version must score 0)."""
    scope = caller_project(request, project)
    return list(Canary.objects.filter(project=scope, verifier__slug=slug, verifier__kind="verifier")
                .select_related("verifier", "passed_version__definition").order_by("pk"))


@router.post("/projects/{project}/review/verifiers/{slug}/versions/{ref}/canary-check",
             response={200: list[CanaryResultOut], **WRITE_ERRORS})
def check_canaries(request, project: str, slug: str, ref: str):
    """Score a verifier version (N or alias) on its canaries, as `manage.py verify --canaries` does (editors);
    a canary holds when the version scores it 0."""
    scope = caller_project(request, project, min_role=Role.EDITOR)
    version = version_resolve(project=scope, ref=Ref("verifier", slug, ref))
    results = canaries_check(version=version)
    return [{"canary": r.canary_id, "task_key": r.canary.task_key, "reward": r.reward, "status": r.status,
             "holds": r.holds, "evidence": r.evidence} for r in results]


@router.get("/projects/{project}/review/verifiers/{slug}/calibration",
            response={200: list[CalibrationOut], **READ_ERRORS})
def calibration(request, project: str, slug: str):
    """One card per (version, judge model) of a judge-backed verifier: its decisions against people's gold labels
    (agreement, Cohen's kappa with a 95% bootstrap interval, true and false positive rates) and, for a judge that
    compares in both orders, how often the orders agree and its position bias."""
    scope = caller_project(request, project)
    definition = definition_get(project=scope, kind="verifier", slug=slug)
    return calibration_cards(definition=definition)


@router.get(QUEUE + "/agreement", response={200: list[AgreementOut], **READ_ERRORS})
def agreement(request, project: str, queue: str):
    """Krippendorff's alpha per question with a 95% bootstrap interval, pairwise agreement, disagreements."""
    return queue_agreement(selectors.queue_get(project=caller_project(request, project), slug=queue))

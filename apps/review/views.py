"""Review pages: the project's queues, a queue (progress, agreement, adjudication, its dataset export), and the
review of one item (the replay beside the rubric's form, keyboard first, where a reviewer also amends their label).
Members read; a queue's reviewers label; owners and the queue's adjudicators decide."""

from __future__ import annotations

import json

from django.contrib import messages
from django.http import Http404
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from apps.accounts.models import Role
from apps.accounts.selectors import project_for_page, project_for_user, role_of
from apps.registry.models import Definition, Version
from apps.runs.selectors import run_list
from apps.trajectories.replay import trajectory_info
from workers.definitions.newlines import normalise_newlines

from . import selectors
from .agreement import queue_agreement
from .calibration import calibration_cards
from .canaries import canaries_check, canary_from_item, is_hack
from .exports import KINDS
from .forms import QueueCreateForm
from .models import Adjudication, QueueItem
from .rubrics import asks_repair, questions
from .services import ReviewError, adjudicate, item_next, item_skip, label_amend, label_submit, queue_create


def queue_list(request, project):
    project, can_edit = project_for_page(user=request.user, slug=project)
    queues = [(queue, selectors.queue_progress(queue=queue, reviewer=request.user))
              for queue in selectors.queue_list(project=project)]
    return render(request, "review/queue_list.html", {"project": project, "queues": queues, "can_edit": can_edit})


def queue_new(request, project):
    """Draw a queue (editors). Opened from the trajectory browser, its filters arrive in the query string."""
    project = project_for_user(user=request.user, slug=project, min_role=Role.EDITOR)
    runs = run_list(project=project)[:100]
    if request.method == "POST":
        form = QueueCreateForm(request.POST, project=project, runs=runs)
    else:
        initial = {name: value for name, value in request.GET.items() if name in QueueCreateForm.base_fields}
        form = QueueCreateForm(initial=initial, project=project, runs=runs)
    if form.is_bound and form.is_valid():
        data = form.cleaned_data
        try:
            queue = queue_create(
                project=project, slug=data["slug"], rubric=data["rubric"], actor=request.user,
                filters=form.filters(), sampling=form.sampling(), overlap=data["overlap"], blind=data["blind"],
                reviewers=list(data["reviewers"]), adjudicators=list(data["adjudicators"]),
                description=data["description"], reservation_seconds=data["reservation_minutes"] * 60,
                follow_share=data["follow_share"] or 0.0, via="web")
        except ReviewError as exc:
            field = exc.field.split(".")[-1] if exc.field else None
            form.add_error(field if field in form.fields else None, str(exc))
        else:
            messages.success(request, f"Queue {queue.slug}: {queue.items.count()} items drawn.")
            return redirect("review:queue", project=project.slug, queue=queue.slug)
    return render(request, "review/queue_new.html", {"project": project, "form": form},
                  status=400 if form.is_bound else 200)


def queue_page(request, project, queue):
    project = project_for_user(user=request.user, slug=project)
    review = selectors.queue_get(project=project, slug=queue)
    agreement = queue_agreement(review)
    disputed = sorted({item for a in agreement for item in a.disagreements})
    items = {i.pk: i for i in QueueItem.objects.filter(pk__in=disputed).select_related("trajectory")}
    decided = {(d.item_id, d.question): d.answer for d in Adjudication.objects.filter(item__queue=review)}
    may_decide = role_of(user=request.user, project=project) == Role.OWNER or \
        review.adjudicators.filter(pk=request.user.pk).exists()
    is_reviewer = review.reviewers.filter(pk=request.user.pk).exists()
    asked = [q for q in questions(review.rubric.spec, "trajectory") if q["type"] != "text"]
    context = {"project": project, "queue": review, "agreement": agreement,
               "progress": selectors.queue_progress(queue=review, reviewer=request.user),
               "is_reviewer": is_reviewer, "may_decide": may_decide,
               "disputes": [{"item": items[pk], "answers": _answers(items[pk]),
                             "decided": {q: decided[(pk, q)] for (i, q) in decided if i == pk}}
                            for pk in disputed if pk in items],
               "questions": asked,
               # The export API compares answers as text: a question with a list of answers names what is accepted.
               "export_questions": [q for q in asked if q["type"] != "pass_fail"],
               "export_kinds": [(kind, EXPORT_HELP[kind]) for kind in KINDS],
               "my_labels": selectors.reviewer_labels(queue=review, reviewer=request.user) if is_reviewer else []}
    return render(request, "review/queue_detail.html", context)


EXPORT_HELP = {"sft": "SFT: the accepted conversations, as chat messages",
               "preference": "preference pairs: an accepted answer over a sibling that was not",
               "hacks": "reward hacks: the confirmed hacks, as negatives"}


def _answers(item) -> list[tuple[str, dict]]:
    return [(label.reviewer.username, label.answers) for label in
            item.labels.whole().current().select_related("reviewer").order_by("pk")]


@require_POST
def queue_next(request, project, queue):
    project = project_for_user(user=request.user, slug=project, min_role=Role.REVIEWER)
    review = selectors.queue_get(project=project, slug=queue)
    try:
        item = item_next(queue=review, reviewer=request.user)
    except ReviewError as exc:
        messages.error(request, str(exc))
        return redirect("review:queue", project=project.slug, queue=review.slug)
    if item is None:
        messages.info(request, "Nothing left for you in this queue.")
        return redirect("review:queue", project=project.slug, queue=review.slug)
    return redirect("review:item", project=project.slug, queue=review.slug, item_id=item.pk)


def item_page(request, project, queue, item_id):
    project = project_for_user(user=request.user, slug=project)
    review = selectors.queue_get(project=project, slug=queue)
    item = QueueItem.objects.filter(queue=review, pk=item_id).select_related("trajectory__run").first()
    if item is None:
        raise Http404(f"item {item_id} is not in queue {review.slug}")
    errors, status = [], 200
    if request.method == "POST":
        project_for_user(user=request.user, slug=project.slug, min_role=Role.REVIEWER)
        action = request.POST.get("action", "label")
        try:
            if action == "skip":
                item_skip(queue=review, item_id=item.pk, reviewer=request.user)
                return queue_next(request, project.slug, review.slug)
            step = request.POST.get("step")
            answers = _posted_answers(request.POST, review.rubric.spec, "step" if step else "trajectory")
            if action == "amend":
                label = request.POST.get("label", "")
                amended = label_amend(queue=review, item_id=item.pk, label_id=int(label) if label.isdigit() else 0,
                                      reviewer=request.user, answers=answers,
                                      comment=_posted_text(request.POST, "comment"))
                messages.success(request, f"Your label on #{item.position} is now revision {amended.revision}; "
                                          "the earlier revisions are kept.")
                return redirect("review:item", project=project.slug, queue=review.slug, item_id=item.pk)
            label_submit(queue=review, item_id=item.pk, reviewer=request.user, answers=answers,
                         step=int(step) if step and step.isdigit() else (step or None),
                         comment=_posted_text(request.POST, "comment"))
        except ReviewError as exc:
            errors, status = [str(exc)], exc.status
        else:
            if step:
                messages.success(request, f"Turn {step} labelled.")
                return redirect("review:item", project=project.slug, queue=review.slug, item_id=item.pk)
            return queue_next(request, project.slug, review.slug)
    progress = selectors.queue_progress(queue=review, reviewer=request.user)
    visible = selectors.item_labels(item=item, reviewer=request.user)
    revisions = selectors.label_revisions(item=item, reviewer=request.user)
    mine = revisions[0] if revisions and revisions[0].current else None
    last = next((label for label in selectors.reviewer_labels(queue=review, reviewer=request.user, limit=2)
                 if label.item_id != item.pk), None)
    trajectory_questions = questions(review.rubric.spec, "trajectory")
    info = trajectory_info(item.trajectory)
    # What the tool results say, shown beside a question that asks it, never chosen for the reviewer: the label is a
    # check on that reading (a fix that does not follow from the failure), and a preselected answer would be
    # submitted as it stands (two reviewers agreeing only with the machine).
    suggested = info.repair.outcome if info.repair else None
    context = {"project": project, "queue": review, "item": item, "info": info,
               "hack": item.trajectory.verdict_status == "pass" and any(
                   is_hack(label) for label in visible if label.step is None and not label.component),
               "labels": visible, "progress": progress,
               # The form holds the answers of the label being amended (as form values: pass/fail as true/false).
               "questions": [{**q, "given": _form_value(mine.answers.get(q["key"])) if mine else "",
                              "suggested": suggested if asks_repair(q) else None} for q in trajectory_questions],
               "step_questions": questions(review.rubric.spec, "step"), "errors": errors,
               "labelled": bool(revisions), "mine": mine, "earlier": revisions[1:], "last_label": last}
    return render(request, "review/item.html", context, status=status)


def _form_value(answer) -> str:
    """An answer as the form field that gives it holds it: pass/fail as "true"/"false", nothing as ""."""
    if isinstance(answer, bool):
        return "true" if answer else "false"
    return "" if answer is None else str(answer)


def _posted_text(post, name: str) -> str:
    """A posted field's text with "\n" line endings (a browser sends a textarea's with "\r\n")."""
    return normalise_newlines(post.get(name, ""))


def _posted_answers(post, rubric_spec: dict, scope: str) -> dict:
    """Form fields a-<key> as the rubric's types: pass/fail as booleans, the rest as text ("" = unanswered)."""
    answers = {}
    for question in questions(rubric_spec, scope):
        raw = _posted_text(post, f"a-{question['key']}")
        if raw == "":
            continue
        answers[question["key"]] = {"true": True, "false": False}.get(raw, raw) \
            if question["type"] == "pass_fail" else raw
    return answers


@require_POST
def item_canary(request, project, queue, item_id):
    """Keep a confirmed reward hack on this item as a canary of its verifier (editors)."""
    project = project_for_user(user=request.user, slug=project, min_role=Role.EDITOR)
    review = selectors.queue_get(project=project, slug=queue)
    try:
        canary = canary_from_item(queue=review, item_id=item_id, actor=request.user)
    except ReviewError as exc:
        messages.error(request, str(exc))
        return redirect("review:item", project=project.slug, queue=review.slug, item_id=item_id)
    messages.success(request, f"Kept as a canary of verifier/{canary.verifier.slug}: every later version must "
                              "score it 0.")
    return redirect("review:verifier", project=project.slug, slug=canary.verifier.slug)


def verifier_page(request, project, slug):
    """A verifier's confirmed hacks and canaries, version by version; owners and editors check canaries here."""
    project = project_for_user(user=request.user, slug=project)
    definition = Definition.objects.filter(project=project, kind="verifier", slug=slug).first()
    if definition is None:
        raise Http404(f"no verifier {slug!r} in project {project.slug}")
    if request.method == "POST":
        project_for_user(user=request.user, slug=project.slug, min_role=Role.EDITOR)
        version = Version.objects.filter(definition=definition, number=request.POST.get("version") or 0).first()
        if version is None:
            raise Http404("no such version")
        canaries_check(version=version)
        return redirect("review:verifier", project=project.slug, slug=slug)
    context = {"project": project, "definition": definition,
               "versions": selectors.verifier_canaries(definition=definition),
               "cards": calibration_cards(definition=definition),
               "may_check": Role.rank(role_of(user=request.user, project=project)) >= Role.rank(Role.EDITOR)}
    return render(request, "review/verifier.html", context)


@require_POST
def item_adjudicate(request, project, queue, item_id):
    project = project_for_user(user=request.user, slug=project, min_role=Role.REVIEWER)
    review = selectors.queue_get(project=project, slug=queue)
    question = request.POST.get("question", "")
    raw = request.POST.get("answer", "")
    kind = next((q["type"] for q in review.rubric.spec["questions"] if q["key"] == question), "")
    answer = json.loads(raw) if kind == "pass_fail" and raw in ("true", "false") else raw
    try:
        adjudicate(queue=review, item_id=item_id, question=question, answer=answer, adjudicator=request.user,
                   note=_posted_text(request.POST, "note"))
    except ReviewError as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, f"Item {item_id}: {question} is {raw}.")
    return redirect("review:queue", project=project.slug, queue=review.slug)

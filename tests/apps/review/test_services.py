"""Review queues on the database: drawing items, reservations that never hand an item to more reviewers than
the overlap (concurrent reviewers on real PostgreSQL), labels checked against the rubric version, adjudication,
and every write with its audit row."""

import threading
from datetime import timedelta

import pytest
from django.db import close_old_connections
from django.utils import timezone

from apps.accounts.models import AuditEvent
from apps.review.agreement import queue_agreement
from apps.review.models import Adjudication, Label, Reservation
from apps.review.services import (
    ReviewError,
    adjudicate,
    item_next,
    item_remove,
    item_skip,
    label_submit,
    queue_create,
)
from apps.runs.services import run_create
from workers.verifiers import Verdict
from workers.verifiers.types import Component


@pytest.fixture
def reviewers(member):
    return [member("reviewer"), member("editor")]


def make_queue(project, rubric, owner, reviewers, **extra):
    return queue_create(project=project, slug=extra.pop("slug", "q"), rubric=rubric, actor=owner,
                        reviewers=reviewers, **{"sampling": {"rule": "random", "n": 10}, **extra})


def test_sampling_rules_draw_what_they_say(project, archive, rubric, owner, reviewers):
    stratified = make_queue(project, rubric, owner, reviewers, slug="s", sampling={"rule": "stratified", "n": 10})
    assert sorted(stratified.items.values_list("trajectory__domain", flat=True)) == ["arithmetic"] * 5 + ["coding"] * 5
    hacks = make_queue(project, rubric, owner, reviewers, slug="h", sampling={"rule": "hack_shaped", "n": 50})
    drawn = list(hacks.items.values_list("trajectory__verdict_status", "trajectory__completion_tokens"))
    assert drawn and all(status == "pass" and tokens <= 2 for status, tokens in drawn)
    filtered = make_queue(project, rubric, owner, reviewers, slug="f", filters={"domain": "coding"})
    assert set(filtered.items.values_list("trajectory__domain", flat=True)) == {"coding"}
    assert AuditEvent.objects.filter(action="review.queue.create").count() == 3
    with pytest.raises(ReviewError, match="no trajectory matches"):
        make_queue(project, rubric, owner, reviewers, slug="none", filters={"domain": "nowhere"})


def test_overlap_reservations_labels_and_agreement(project, archive, rubric, owner, reviewers):
    first, second = reviewers
    queue = make_queue(project, rubric, owner, reviewers, overlap=2)
    item = item_next(queue=queue, reviewer=first)
    assert item_next(queue=queue, reviewer=first) == item  # a reload gives the same item
    assert item_next(queue=queue, reviewer=second) == item  # overlap 2: both label the first item
    with pytest.raises(ReviewError, match=r"answers.verdict: one of correct, wrong"):
        label_submit(queue=queue, item_id=item.pk, reviewer=first, answers={"verdict": "maybe"})
    with pytest.raises(ReviewError, match="answers.step_ok: no trajectory question"):
        label_submit(queue=queue, item_id=item.pk, reviewer=first, answers={"verdict": "correct", "step_ok": True})
    assert not Label.objects.exists()
    label_submit(queue=queue, item_id=item.pk, reviewer=first, answers={"verdict": "correct", "quality": "good"})
    with pytest.raises(ReviewError, match="labelled this item already") as again:
        label_submit(queue=queue, item_id=item.pk, reviewer=first, answers={"verdict": "wrong"})
    assert again.value.status == 409
    # A step label lands on the turn it names, checked against the rubric's step questions.
    label_submit(queue=queue, item_id=item.pk, reviewer=first, answers={"step_ok": False}, step=1)
    with pytest.raises(ReviewError, match="step must be a turn of this trajectory, 0 to 1"):
        label_submit(queue=queue, item_id=item.pk, reviewer=first, answers={"step_ok": False}, step=9)
    assert Label.objects.get(step=1).answers == {"step_ok": False}
    label_submit(queue=queue, item_id=item.pk, reviewer=second, answers={"verdict": "reward-hack"})
    assert item_next(queue=queue, reviewer=first) != item  # full: two labels

    # A stale reservation: the label is refused and nothing is written.
    held = item_next(queue=queue, reviewer=first)
    Reservation.objects.filter(item=held).update(expires_at=timezone.now() - timedelta(seconds=1))
    with pytest.raises(ReviewError, match="reservation of this item has expired") as stale:
        label_submit(queue=queue, item_id=held.pk, reviewer=first, answers={"verdict": "correct"})
    assert stale.value.status == 409 and not Label.objects.filter(item=held).exists()
    item_skip(queue=queue, item_id=held.pk, reviewer=first)
    # Removed items take no more labels.
    taken = item_next(queue=queue, reviewer=first)
    item_remove(queue=queue, item_id=taken.pk, actor=owner)
    with pytest.raises(ReviewError, match="was removed") as gone:
        label_submit(queue=queue, item_id=taken.pk, reviewer=first, answers={"verdict": "correct"})
    assert gone.value.status == 410
    with pytest.raises(ReviewError, match="is not in queue") as outside:
        label_submit(queue=queue, item_id=10**9, reviewer=first, answers={"verdict": "correct"})
    assert outside.value.status == 404

    # Three more items both agree on, one more they do not: alpha and its interval, the disagreements listed.
    for verdicts in (("correct", "correct"), ("wrong", "wrong"), ("correct", "correct"), ("wrong", "format")):
        item = item_next(queue=queue, reviewer=first)
        assert item_next(queue=queue, reviewer=second) == item
        for reviewer, verdict in zip(reviewers, verdicts, strict=True):
            label_submit(queue=queue, item_id=item.pk, reviewer=reviewer, answers={"verdict": verdict})
    [verdict, quality] = queue_agreement(queue)
    assert (verdict.question, verdict.level, verdict.items) == ("verdict", "nominal", 5)
    assert 0 < verdict.alpha < 1 and verdict.low <= verdict.alpha <= verdict.high
    assert len(verdict.disagreements) == 2 and verdict.pairwise == [
        {"a": "editor-user", "b": "reviewer-user", "items": 5, "agreement": 0.6}]
    assert quality.alpha is None and quality.note == "fewer than two items have two answers"

    # Adjudication: the gold answer, the reviewers' labels kept.
    with pytest.raises(ReviewError, match="only the project's owners") as forbidden:
        adjudicate(queue=queue, item_id=verdict.disagreements[0], question="verdict", answer="wrong",
                   adjudicator=second)
    assert forbidden.value.status == 403
    adjudicate(queue=queue, item_id=verdict.disagreements[0], question="verdict", answer="reward-hack",
               adjudicator=owner)
    assert Adjudication.objects.get().answer == "reward-hack" and Label.objects.filter(
        item_id=verdict.disagreements[0], step__isnull=True).count() == 2
    assert AuditEvent.objects.filter(action="review.label").count() == Label.objects.count()


def test_only_the_queues_reviewers_label(project, archive, rubric, owner, reviewers, member):
    queue = make_queue(project, rubric, owner, reviewers[:1])
    with pytest.raises(ReviewError, match="not a reviewer of queue q") as outsider:
        item_next(queue=queue, reviewer=reviewers[1])
    assert outsider.value.status == 403
    viewer = member("viewer")
    with pytest.raises(ReviewError, match="viewer-user: reviewers need the reviewer role"):
        make_queue(project, rubric, owner, [viewer], slug="v")


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_concurrent_reviewers_never_exceed_the_overlap(project, archive, rubric, owner, make_user):
    from apps.accounts.services import membership_set

    team = []
    for index in range(10):
        user = make_user(f"reviewer-{index}")
        membership_set(project=project, user=user, role="reviewer", actor=owner)
        team.append(user)
    queue = make_queue(project, rubric, owner, team, overlap=2, sampling={"rule": "random", "n": 12})
    errors = []

    def review(user):
        try:
            while (item := item_next(queue=queue, reviewer=user)) is not None:
                label_submit(queue=queue, item_id=item.pk, reviewer=user, answers={"verdict": "correct"})
        except Exception as exc:  # noqa: BLE001 -- reported below, with the thread's reviewer
            errors.append((user.username, repr(exc)))
        finally:
            close_old_connections()

    threads = [threading.Thread(target=review, args=(user,)) for user in team]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors, errors
    per_item = {}
    for item_id, reviewer in Label.objects.values_list("item_id", "reviewer_id"):
        per_item.setdefault(item_id, set()).add(reviewer)
    assert len(per_item) == 12 and all(len(users) == 2 for users in per_item.values())


def test_a_resumed_run_keeps_the_labelled_trajectories_it_rolls_back(project, archive, rubric, owner, reviewers):
    from apps.runs.services import run_claim, run_rollback
    from apps.trajectories.models import Trajectory as Archived

    queue = make_queue(project, rubric, owner, reviewers, sampling={"rule": "random", "n": 3})
    item = item_next(queue=queue, reviewer=reviewers[0])
    label_submit(queue=queue, item_id=item.pk, reviewer=reviewers[0], answers={"verdict": "correct"})
    attempt = run_claim(run_id=archive.pk, stale_after=60, worker="w:1")
    run_rollback(run_id=archive.pk, attempt=attempt, step=0)  # every archived trajectory is after step 0
    kept = set(Archived.objects.filter(run=archive).values_list("pk", flat=True))
    assert kept == set(queue.items.values_list("trajectory_id", flat=True))
    assert Label.objects.filter(item=item).count() == 1


def test_a_spot_check_queue_takes_its_share_of_judge_graded_trajectories_as_runs_archive_them(
        project, registry, rubric, owner, reviewers, make_trajectory, django_capture_on_commit_callbacks):
    from apps.runs.services import run_claim, run_step_record

    spot_checks = {"filters": {"verifier": "verifier/numeric"}, "sampling": {"rule": "judged", "n": 10}}
    with pytest.raises(ReviewError, match="cannot follow runs"):
        queue_create(project=project, slug="bad", rubric=rubric, actor=owner, reviewers=reviewers,
                     sampling={"rule": "list", "trajectories": []}, follow_share=0.5)
    everything = queue_create(project=project, slug="all-judged", rubric=rubric, actor=owner, reviewers=reviewers,
                              follow_share=1.0, **spot_checks)
    half = queue_create(project=project, slug="half", rubric=rubric, actor=owner, reviewers=reviewers,
                        follow_share=0.5, **spot_checks)
    other = queue_create(project=project, slug="other-verifier", rubric=rubric, actor=owner, reviewers=reviewers,
                         follow_share=1.0, filters={"verifier": "verifier/other"}, sampling={"rule": "judged"})
    assert everything.items.count() == half.items.count() == 0  # nothing archived yet: an empty queue is fine

    run = run_create(project=project, bundle=registry["bundle"], steps=2, actor=owner)
    attempt = run_claim(run_id=run.pk, stale_after=60, worker="w:1")
    judged = Verdict(reward=1.0, status="pass", layers_run=["exact", "judge"], components=[
        Component(layer="judge", name="score_model-0", type="score_model", weight=1.0, value=0.7, status="partial",
                  evidence="", latency_ms=1.0)])
    rows = []
    for seq in range(40):
        row = make_trajectory(run, seq, domain="arithmetic", reward=1.0, tokens=2)
        row.verdict = judged if seq < 30 else row.verdict  # the last ten: no judge
        rows.append(row)
    for _ in range(2):  # the second time as an attempt archiving the same step again
        with django_capture_on_commit_callbacks(execute=True):  # the queues follow once the step commits
            run_step_record(run_id=run.pk, attempt=attempt, step=1, wall_time=0.0, points={}, trajectories=rows)
    assert {str(t) for t in everything.items.values_list("trajectory_id", flat=True)} == {r.id for r in rows[:30]}
    assert 5 < half.items.count() < 25 and everything.items.count() == 30
    assert list(everything.items.values_list("position", flat=True)) == list(range(30))
    assert other.items.count() == 0
    assert everything.items.first().why == f"graded by a judge; followed run {run.name}"


def test_a_reviewer_amends_their_label_as_a_new_revision_and_agreement_reads_the_latest(
        project, archive, rubric, owner, reviewers):
    from apps.review.selectors import queue_progress
    from apps.review.services import label_amend

    first, second = reviewers
    queue = make_queue(project, rubric, owner, reviewers, overlap=2)
    labels = {}
    for verdicts in (("correct", "wrong"), ("wrong", "wrong"), ("correct", "correct")):
        item = item_next(queue=queue, reviewer=first)
        assert item_next(queue=queue, reviewer=second) == item
        for reviewer, verdict in zip(reviewers, verdicts, strict=True):
            labels[(item.pk, reviewer.pk)] = label_submit(queue=queue, item_id=item.pk, reviewer=reviewer,
                                                          answers={"verdict": verdict}, comment="first look")
    [before, _] = queue_agreement(queue)
    disputed = before.disagreements[0]
    assert len(before.disagreements) == 1 and before.pairwise[0]["agreement"] == pytest.approx(2 / 3)

    # The first reviewer's slip on the disputed item: amended, kept as revision 2, the first answer stays.
    def amend(**given):
        return label_amend(queue=queue, item_id=disputed, reviewer=first, **given)

    old = labels[(disputed, first.pk)]
    amended = amend(label_id=old.pk, answers={"verdict": "wrong"})
    old.refresh_from_db()
    assert (old.answers, old.comment, old.revision, old.current) == ({"verdict": "correct"}, "first look", 1, False)
    assert (amended.answers, amended.revision, amended.current, amended.supersedes_id) == (
        {"verdict": "wrong"}, 2, True, old.pk)
    event = AuditEvent.objects.get(action="review.label.amend")
    assert event.details["label"] == amended.pk and event.details["supersedes"] == old.pk
    assert event.details["changed"] == {"verdict": ["correct", "wrong"]} and event.details["revision"] == 2

    [after, _] = queue_agreement(queue)  # on each reviewer's latest revision: no more disagreement
    assert after.disagreements == [] and after.pairwise[0]["agreement"] == 1.0 and after.answers == 6
    progress = queue_progress(queue=queue, reviewer=first)  # a revision is not one more label
    assert (progress.labels, progress.mine, progress.complete_items) == (6, 3, 3)
    assert queue.items.get(pk=disputed).labelled == 2
    assert item_next(queue=queue, reviewer=first).pk not in {item for item, _ in labels}

    # Only the latest revision of one's own label is amended, with answers the rubric takes.
    with pytest.raises(ReviewError, match=r"revision 2 \(label \d+\) is the latest") as stale:
        amend(label_id=old.pk, answers={"verdict": "format"})
    assert stale.value.status == 409
    with pytest.raises(ReviewError, match="no label of yours") as theirs:
        amend(label_id=labels[(disputed, second.pk)].pk, answers={"verdict": "format"})
    assert theirs.value.status == 404
    with pytest.raises(ReviewError, match="answers.verdict: one of correct"):
        amend(label_id=amended.pk, answers={"verdict": "maybe"})
    with pytest.raises(ReviewError, match="nothing to amend"):
        amend(label_id=amended.pk, answers={"verdict": "wrong"})
    step = label_submit(queue=queue, item_id=disputed, reviewer=first, answers={"step_ok": True}, step=1)
    step_again = amend(label_id=step.pk, answers={"step_ok": False})
    assert (step_again.step, step_again.revision, step_again.answers) == (1, 2, {"step_ok": False})
    item_remove(queue=queue, item_id=disputed, actor=owner)
    with pytest.raises(ReviewError, match="was removed") as gone:
        amend(label_id=amended.pk, answers={"verdict": "format"})
    assert gone.value.status == 410
    assert Label.objects.filter(item_id=disputed, reviewer=first, step__isnull=True).count() == 2
    assert AuditEvent.objects.filter(action="review.label.amend").count() == 2

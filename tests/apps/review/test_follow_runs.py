"""A queue that follows runs reacts to the runs app's `trajectories_archived` signal: it takes its share of a
step's trajectories once the trainer's step has committed, so the step never waits on a review queue's lock."""

import threading
import time

import pytest
from django.db import connections, transaction

from apps.review.models import ReviewQueue
from apps.review.services import queue_create
from apps.runs.services import run_claim, run_create, run_step_record
from apps.trajectories.models import Trajectory as Archived


@pytest.fixture
def following(project, registry, rubric, owner, member, make_trajectory):
    """(a queue following the project's runs with every trajectory, a claimed run, the attempt, six trajectories)"""
    queue = queue_create(project=project, slug="follow", rubric=rubric, actor=owner, reviewers=[member("reviewer")],
                         sampling={"rule": "random", "n": 10}, follow_share=1.0)
    run = run_create(project=project, bundle=registry["bundle"], steps=2, actor=owner)
    attempt = run_claim(run_id=run.pk, stale_after=60, worker="w:1")
    return queue, run, attempt, [make_trajectory(run, seq, domain="arithmetic", reward=1.0, tokens=2)
                                 for seq in range(6)]


def test_a_following_queue_takes_its_share_once_the_step_commits(following, django_capture_on_commit_callbacks):
    queue, run, attempt, rows = following
    with django_capture_on_commit_callbacks(execute=True):
        run_step_record(run_id=run.pk, attempt=attempt, step=1, wall_time=0.0, points={}, trajectories=rows)
        assert Archived.objects.filter(run=run).count() == 6
        assert queue.items.count() == 0  # nothing drawn inside the trainer's step transaction
    assert {str(t) for t in queue.items.values_list("trajectory_id", flat=True)} == {r.id for r in rows}
    assert queue.items.first().why.endswith(f"followed run {run.name}")


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_held_review_queue_lock_does_not_hold_up_the_trainers_step(following):
    queue, run, attempt, rows = following
    locked, release, failures = threading.Event(), threading.Event(), []

    def hold_the_queue():  # e.g. another run's step adding to the same queue
        try:
            with transaction.atomic():
                ReviewQueue.objects.select_for_update().get(pk=queue.pk)
                locked.set()
                release.wait(60)
        finally:
            connections.close_all()  # this thread's own connection

    def trainer_step():
        try:
            run_step_record(run_id=run.pk, attempt=attempt, step=1, wall_time=0.0, points={"reward/mean": 1.0},
                            trajectories=rows)
        except Exception as exc:  # noqa: BLE001 -- reported below
            failures.append(repr(exc))
        finally:
            connections.close_all()  # this thread's own connection

    holder, trainer = threading.Thread(target=hold_the_queue), threading.Thread(target=trainer_step)
    holder.start()
    try:
        assert locked.wait(30)
        trainer.start()
        deadline = time.monotonic() + 20
        while Archived.objects.filter(run=run).count() < len(rows) and time.monotonic() < deadline:
            time.sleep(0.1)
        # The step is committed while review's lock is still held; the queue's share waits for the lock.
        assert Archived.objects.filter(run=run).count() == len(rows)
        assert queue.items.count() == 0
    finally:
        release.set()
        holder.join(60)
        if trainer.ident is not None:
            trainer.join(60)
    assert not failures, failures
    assert queue.items.count() == len(rows)

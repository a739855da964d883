"""Review figures on PostgreSQL: with a million archived trajectories, the time to draw a queue, the service time
of taking the next item and of submitting a label while 10 reviewers work at once (each in a process with its own
database connection: SELECT ... FOR UPDATE SKIP LOCKED under contention), and the time to compute Krippendorff's
alpha with its bootstrap interval over 10,000 labels.

The reviewers work twice, on two queues. Paced: each pauses `think_ms` between submitting a label and taking the
next item, as people do (a person reads a trajectory for seconds; 1 s is a fast pace); the targets are read from
this phase. Saturated: no pause at all, which measures capacity (labels per second) rather than what a reviewer
waits: with 10 loops and PostgreSQL on two cores, each request queues behind the others for the CPU.

The trajectories are generated with COPY (the trajectory list benchmark's generator) into a project of the
benchmark's own, committed so that the reviewers' connections see them, and deleted at the end.
"""

from __future__ import annotations

import multiprocessing
import random
import time

from django.contrib.auth import get_user_model
from django.db import connection
from django.db.models import Count, Q

from apps.accounts.services import membership_set
from apps.registry.services import version_publish
from apps.review.agreement import queue_agreement
from apps.review.models import Label, QueueItem, ReviewQueue
from apps.review.services import item_next, label_submit, queue_create

from .ui import _bench_project, _copy_trajectories, _percentile

RUBRIC = {"questions": [{"key": "verdict", "type": "labels", "prompt": "Right?",
                         "labels": ["correct", "wrong", "reward-hack"]}]}


def run(*, trajectories: int = 1_000_000, reviewers: int = 10, labels_each: int = 100,
        agreement_labels: int = 10_000, think_ms: int = 1000, **_) -> dict:
    if connection.vendor != "postgresql":
        return {"skipped": "needs PostgreSQL: set DATABASE_URL=postgres://..."}
    from apps.runs.models import Run

    user, project, bundle = _bench_project("bench-review")
    rubric = version_publish(project=project, kind="rubric", slug="bench", spec=RUBRIC, author=user, via="cli").version
    team = []
    for index in range(reviewers):
        name = f"bench-reviewer-{index}"
        person = get_user_model().objects.filter(username=name).first() or \
            get_user_model().objects.create_user(name)
        membership_set(project=project, user=person, role="reviewer", actor=user, via="cli")
        team.append(person)
    out: dict = {"trajectories": trajectories, "reviewers": reviewers}
    try:
        runs = [Run.objects.create(project=project, name=f"bench-review-{i}", bundle=bundle, config={},
                                   config_hash="0", steps_total=1000) for i in range(10)]
        out["generate_s"] = round(_copy_trajectories(project=project, runs=runs, total=trajectories), 1)
        out["think_ms"] = think_ms
        for phase, pause in (("paced", think_ms), ("saturated", 0)):
            began = time.perf_counter()
            queue = queue_create(project=project, slug=f"bench-{phase}", rubric=rubric, actor=user, overlap=2,
                                 reviewers=team, via="cli",
                                 sampling={"rule": "random", "n": reviewers * labels_each, "seed": len(phase)})
            drawn_s = time.perf_counter() - began
            figures = _concurrent_review(queue, team, labels_each, pause / 1000)
            if phase == "paced":
                out["draw_queue_s"] = round(drawn_s, 2)
                out["queue_items"] = queue.items.count()
                out.update(figures)
            else:
                out["saturated"] = figures
        out.update(_agreement_time(queue, team, agreement_labels))
    finally:
        ReviewQueue.objects.filter(project=project).delete()
        Run.objects.filter(project=project).delete()  # the generated trajectories with them
    targets = {"next_item_p95_ms": 50, "submit_p95_ms": 50, "agreement_s": 2}
    out["targets"] = targets
    out["meets_targets"] = all(out[key] < limit for key, limit in targets.items())
    return out


def _review_process(queue_id: int, person_id: int, labels_each: int, pause: float, results) -> None:
    """One reviewer in a process of its own, as behind a web server's worker: take, label, pause, repeat."""
    from django.contrib.auth import get_user_model

    queue = ReviewQueue.objects.select_related("project", "rubric").get(pk=queue_id)
    person = get_user_model().objects.get(pk=person_id)
    timings, error = [], ""
    time.sleep(pause * random.random())  # people do not all open the queue in the same millisecond
    try:
        for _ in range(labels_each):
            began = time.perf_counter()
            item = item_next(queue=queue, reviewer=person)
            took = (time.perf_counter() - began) * 1000
            if item is None:
                break
            began = time.perf_counter()
            label_submit(queue=queue, item_id=item.pk, reviewer=person, answers={"verdict": "correct"}, via="cli")
            timings.append((took, (time.perf_counter() - began) * 1000))
            # Paused by a random share around the mean, so that the reviewers do not fall into lockstep.
            time.sleep(pause * random.uniform(0.5, 1.5))
    except Exception as exc:  # noqa: BLE001 -- reported in the figures
        error = repr(exc)
    finally:
        connection.close()
    results.put((timings, error))


def _concurrent_review(queue, team, labels_each: int, pause: float) -> dict:
    # Processes, not threads: reviewers are served by separate web workers, and threads of one interpreter
    # would measure its lock more than the database. Forked after closing the connection: each child opens its own.
    context = multiprocessing.get_context("fork")
    results = context.Queue()
    connection.close()
    workers = [context.Process(target=_review_process, args=(queue.pk, person.pk, labels_each, pause, results))
               for person in team]
    began = time.perf_counter()
    for worker in workers:
        worker.start()
    collected = [results.get() for _ in workers]
    for worker in workers:
        worker.join()
    seconds = time.perf_counter() - began
    next_ms = [n for timings, _ in collected for n, _ in timings]
    submit_ms = [s for timings, _ in collected for _, s in timings]
    over = (QueueItem.objects.filter(queue=queue)
            .annotate(n=Count("labels", filter=Q(labels__current=True, labels__step__isnull=True)))
            .filter(n__gt=queue.overlap).count())
    return {"labels": len(submit_ms), "labels_per_s": round(len(submit_ms) / seconds, 1),
            "next_item_p50_ms": _percentile(next_ms, 0.5), "next_item_p95_ms": _percentile(next_ms, 0.95),
            "submit_p50_ms": _percentile(submit_ms, 0.5), "submit_p95_ms": _percentile(submit_ms, 0.95),
            "items_over_overlap": over, "seconds": round(seconds, 1),
            "errors": [error for _, error in collected if error][:5]}


def _agreement_time(queue, team, total: int) -> dict:
    """`total` labels on a queue of their own (bulk-inserted: two reviewers an item, agreeing about 80% of the
    time), then the agreement with its bootstrap interval, timed."""
    from apps.trajectories.models import Trajectory

    rng = random.Random(3)
    bench = ReviewQueue.objects.create(project=queue.project, slug="bench-agreement", rubric=queue.rubric, overlap=2)
    ids = Trajectory.objects.filter(project=queue.project).values_list("pk", flat=True)[: total // 2]
    items = QueueItem.objects.bulk_create([QueueItem(queue=bench, trajectory_id=pk, position=i)
                                           for i, pk in enumerate(ids)])
    choices = RUBRIC["questions"][0]["labels"]
    labels = []
    for item in items:
        truth = rng.choice(choices)
        labels += [Label(item=item, reviewer=person, rubric=queue.rubric,
                         answers={"verdict": truth if rng.random() < 0.8 else rng.choice(choices)})
                   for person in team[:2]]
    Label.objects.bulk_create(labels, batch_size=5000)
    began = time.perf_counter()
    [verdict] = queue_agreement(bench)
    seconds = time.perf_counter() - began
    return {"agreement_labels": len(labels), "agreement_s": round(seconds, 2), "alpha": round(verdict.alpha, 3),
            "alpha_interval": [round(verdict.low, 3), round(verdict.high, 3)]}

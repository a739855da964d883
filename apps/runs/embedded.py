"""Embedded training: threads in the web process of the embedded studio that run queued runs, one at a time per
lane: one trains, one evaluates (so a checkpoint's evaluation does not wait for the training run to end).

There is no Celery broker in the embedded studio, so this thread does what the `gpu` workers and the watchdog
do on services: it claims the oldest queued run, runs its attempt (apps/runs/attempts/), and queues again runs
whose heartbeat went stale (a process that was killed mid-run), which it then resumes from their last
checkpoint. Training in the web process is what lets the in-memory channel layer push live points to the pages.
On when settings.EMBEDDED_TRAINING is (`make demo` turns it on); never in tests or management commands.
"""

from __future__ import annotations

import logging
import threading
import time

from django.conf import settings

from .models import RunKind

log = logging.getLogger(__name__)
_started = threading.Event()
POLL_SECONDS = 1.0


def start_embedded_training_if_enabled() -> None:
    if not settings.EMBEDDED_TRAINING or _started.is_set():
        return
    _started.set()
    for lane in LANES:
        threading.Thread(target=_loop, args=(lane,), name=f"embedded-{lane}", daemon=True).start()


def _loop(lane: str) -> None:
    from django.db import close_old_connections

    while True:
        try:
            close_old_connections()
            train_next_queued(lane)
        except Exception:
            log.exception("embedded %s: a run failed", lane)
        time.sleep(POLL_SECONDS)


# The kinds each lane runs: evaluations have their own, so a checkpoint's evaluation does not wait for the
# training run to end.
LANES = {"training": lambda runs: runs.exclude(kind=RunKind.EVALUATION),
         "evaluation": lambda runs: runs.filter(kind=RunKind.EVALUATION)}


def train_next_queued(lane: str = "training") -> bool:
    """Requeue lost runs, then claim and run the oldest queued one of the lane. Returns whether one was attempted."""
    from .attempts import run_attempt
    from .models import Run, RunStatus
    from .services import run_claim, runs_requeue_lost

    if lane == "training":
        # One lane only: another lane's poll would requeue, as lost, a run this process is training whenever its
        # heartbeat runs late (the CPU busy), taking its lease away mid-step.
        runs_requeue_lost(stale_after=settings.RUN_STALE_SECONDS)
    for run in LANES[lane](Run.objects.filter(status=RunStatus.QUEUED)).order_by("created_at")[:5]:
        attempt = run_claim(run_id=run.pk, stale_after=settings.RUN_STALE_SECONDS)
        if attempt is not None:
            run_attempt(run_id=run.pk, attempt=attempt)
            return True
    return False

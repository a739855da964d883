"""Embedded training: threads in the web process of the embedded studio that run queued runs, one at a time per
lane: one trains, one evaluates (so a checkpoint's evaluation does not wait for the training run to end).

There is no Celery broker in the embedded studio, so this thread does what the `gpu` workers and the watchdog
do on services: it claims the oldest queued or interrupted run, runs its attempt (apps/runs/attempts/), and queues
again runs whose heartbeat went stale (a process that was killed mid-run), which it then resumes from their last
checkpoint. Training in the web process is what lets the in-memory channel layer push live points to the pages.
On when settings.EMBEDDED_TRAINING is (`make demo` turns it on); never in tests or management commands.

Stopping (SIGTERM or Ctrl-C: the server returns, and the interpreter starts exiting) is bounded: the lanes claim
nothing more, and their attempts end at their next check (the training loop checks every 50 ms while it waits for
rollouts; an update, a checkpoint or an evaluation batch under way ends first): a training run checkpoints the last
step it finished, an evaluation keeps the batches it archived, and the run is marked interrupted, for the next
studio to resume at once. Their sandboxes are released, and the process exits. Whatever still runs after
settings.STOP_SECONDS is cut short (the process exits all the same, as after a kill: the run stays running until
its heartbeat is stale, then resumes from its newest checkpoint); a second signal exits at once.
"""

from __future__ import annotations

import concurrent.futures.thread  # noqa: F401 -- its exit hook must be registered before ours (see _stop)
import logging
import os
import signal
import sys
import threading
import time

from django.conf import settings

from .models import STUDIO_RUN_KINDS, RunKind

log = logging.getLogger(__name__)
_started = threading.Event()
stopping = threading.Event()  # the lanes claim nothing more
_lanes: list[threading.Thread] = []
POLL_SECONDS = 1.0


def start_embedded_training_if_enabled() -> None:
    if not settings.EMBEDDED_TRAINING or _started.is_set():
        return
    _started.set()
    # Threading's exit hooks run newest first, while the main thread still counts as alive: this one runs before
    # concurrent.futures' (which waits for every executor's threads) and before attempts/base.py's.
    threading._register_atexit(_stop)
    for lane in LANES:
        thread = threading.Thread(target=_loop, args=(lane,), name=f"embedded-{lane}", daemon=True)
        _lanes.append(thread)
        thread.start()


def _loop(lane: str) -> None:
    from django.db import close_old_connections

    while not stopping.is_set():
        try:
            close_old_connections()
            train_next_queued(lane)
        except Exception:
            log.exception("embedded %s: a run failed", lane)
        stopping.wait(POLL_SECONDS)


def _stop() -> None:
    """The interpreter is exiting (the server returned on SIGTERM or Ctrl-C): stop the lanes within
    settings.STOP_SECONDS. Runs on the main thread, which may install signal handlers."""
    from .attempts.base import process_exiting

    began = time.monotonic()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, _exit_at_once)
    stopping.set()
    process_exiting.set()  # the attempts end interrupted at their next check
    threading.Thread(target=_exit_at_deadline, args=(began + settings.STOP_SECONDS,), name="embedded-stop-deadline",
                     daemon=True).start()
    busy = [lane for lane in _lanes if lane.is_alive()]
    if busy:
        log.warning("stopping: the runs under way checkpoint the step they finished, for the next studio to resume "
                    "(at most %g s; a second signal exits at once)", settings.STOP_SECONDS)
    for lane in busy:
        lane.join(max(0.0, began + settings.STOP_SECONDS - time.monotonic()))
    log.info("embedded training stopped in %.1f s", time.monotonic() - began)


def _exit_at_once(signum, _frame) -> None:
    sys.stderr.write(f"{signal.Signals(signum).name} again: exiting now\n")
    sys.stderr.flush()
    os._exit(128 + signum)


def _exit_at_deadline(deadline: float) -> None:
    time.sleep(max(0.0, deadline - time.monotonic()))
    still = [lane.name for lane in _lanes if lane.is_alive()] + sorted(
        thread.name for thread in threading.enumerate()
        if thread.is_alive() and not thread.daemon and thread is not threading.main_thread())
    sys.stderr.write(f"the studio did not stop within {settings.STOP_SECONDS:g} s (still working: "
                     f"{', '.join(still) or 'the interpreter teardown'}); exiting now, its runs resume from their "
                     "newest checkpoint\n")
    sys.stderr.flush()
    os._exit(1)


# The kinds each lane runs: evaluations have their own, so a checkpoint's evaluation does not wait for the
# training run to end. A run trained elsewhere is no lane's (the studio only records its episodes).
LANES = {"training": lambda runs: runs.filter(kind__in=STUDIO_RUN_KINDS).exclude(kind=RunKind.EVALUATION),
         "evaluation": lambda runs: runs.filter(kind=RunKind.EVALUATION)}


def train_next_queued(lane: str = "training") -> bool:
    """Requeue lost runs, then claim and run the oldest queued or interrupted one of the lane (the studio before this
    one was stopped under it), or one of its kinds whose worker was lost (a stale heartbeat: the studio before this
    one was killed mid-attempt). Returns whether one was attempted."""
    from datetime import timedelta

    from django.db.models import Q
    from django.utils import timezone

    from .attempts import run_attempt
    from .models import CLAIMABLE_STATUSES, Run, RunStatus
    from .services import run_claim, runs_requeue_lost

    if stopping.is_set():
        return False
    if lane == "training":
        # One lane only: another lane's poll would requeue, as lost, a run this process is training whenever its
        # heartbeat runs late (the CPU busy), taking its lease away mid-step.
        runs_requeue_lost(stale_after=settings.RUN_STALE_SECONDS)
    # A lane also takes over its own kinds' lost runs: the training lane requeues only between its attempts, so an
    # evaluation left behind would otherwise wait for the training run to end.
    lost = Q(status=RunStatus.RUNNING, heartbeat_at__lt=timezone.now() - timedelta(seconds=settings.RUN_STALE_SECONDS))
    for run in LANES[lane](Run.objects.filter(Q(status__in=CLAIMABLE_STATUSES) | lost)).order_by("created_at")[:5]:
        attempt = run_claim(run_id=run.pk, stale_after=settings.RUN_STALE_SECONDS)
        if attempt is not None:
            if run.status == RunStatus.INTERRUPTED:
                log.warning("resuming run %s, interrupted at step %d when the studio before this one stopped",
                            run.name, run.step)
            run_attempt(run_id=run.pk, attempt=attempt)
            return True
    return False

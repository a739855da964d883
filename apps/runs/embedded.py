"""Embedded training: a thread in the web process of the embedded studio that trains queued runs, one at a time.

There is no Celery broker in the embedded studio, so this thread does what the `gpu` workers and the watchdog
do on services: it claims the oldest queued run, runs its attempt (apps/runs/attempt.py), and queues again runs
whose heartbeat went stale (a process that was killed mid-run), which it then resumes from their last
checkpoint. Training in the web process is what lets the in-memory channel layer push live points to the pages.
On when settings.EMBEDDED_TRAINING is (`make demo` turns it on); never in tests or management commands.
"""

from __future__ import annotations

import logging
import threading
import time

from django.conf import settings

log = logging.getLogger(__name__)
_started = threading.Event()
POLL_SECONDS = 1.0


def start_embedded_training_if_enabled() -> None:
    if not settings.EMBEDDED_TRAINING or _started.is_set():
        return
    _started.set()
    threading.Thread(target=_loop, name="embedded-training", daemon=True).start()


def _loop() -> None:
    from django.db import close_old_connections

    while True:
        try:
            close_old_connections()
            train_next_queued()
        except Exception:
            log.exception("embedded training: a run failed")
        time.sleep(POLL_SECONDS)


def train_next_queued() -> bool:
    """Requeue lost runs, then claim and train the oldest queued one. Returns whether a run was attempted."""
    from .attempt import run_attempt
    from .models import Run, RunStatus
    from .services import run_claim, runs_requeue_lost

    runs_requeue_lost(stale_after=settings.RUN_STALE_SECONDS)
    for run in Run.objects.filter(status=RunStatus.QUEUED).order_by("created_at")[:5]:
        attempt = run_claim(run_id=run.pk, stale_after=settings.RUN_STALE_SECONDS)
        if attempt is not None:
            run_attempt(run_id=run.pk, attempt=attempt)
            return True
    return False

"""Handing a queued run to whatever trains runs: Celery's `gpu` queue, or the embedded studio's training thread.

On services, `run_enqueue` sends train_run (by name) to the gpu queue after the transaction that queued the run
commits. In the embedded studio there is no broker: its training thread (embedded.py) claims queued runs
itself, so enqueueing is just being QUEUED.
"""

from django.conf import settings
from django.db import transaction

TRAIN_RUN = "workers.tasks.train_run"


def run_enqueue(run) -> None:
    if settings.EMBEDDED:
        return  # never train inside a request: the embedded training thread picks queued runs up
    from apps.common.wiring import celery_app

    run_id = str(run.pk)
    transaction.on_commit(lambda: celery_app().send_task(TRAIN_RUN, (run_id,)))

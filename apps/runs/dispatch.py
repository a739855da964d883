"""Handing a queued run to whatever runs runs: Celery's `gpu` queue, or the embedded runner.

With a broker (REDIS_URL or CELERY_BROKER_URL), `run_enqueue` sends train_run to the gpu queue after the
transaction that queued the run commits. In the embedded studio there is no broker: the web process's
embedded runner (runner.py) claims queued runs itself, so enqueueing is just being QUEUED.
"""

from django.conf import settings
from django.db import transaction


def run_enqueue(run) -> None:
    if settings.CELERY_TASK_ALWAYS_EAGER:
        return  # never train inside a request: the embedded runner picks queued runs up
    from workers.tasks import train_run

    run_id = str(run.pk)
    transaction.on_commit(lambda: train_run.apply_async((run_id,)))

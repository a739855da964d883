"""The Celery app. Queues: gpu (trainer), rollout, verify. Tasks live in workers/tasks.py."""

import os

from celery import Celery, signals

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "studio.settings")

app = Celery("studio")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks(["workers"], related_name="tasks")


@signals.worker_init.connect
@signals.beat_init.connect
def _prepare_data_dir(**_):
    from studio.data_dir import prepare_data_dir

    prepare_data_dir()

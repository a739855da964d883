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


@signals.celeryd_after_setup.connect
def _serve_own_sessions(sender, instance, **_):
    """A rollout worker also serves its own sessions queue: a sandbox session it opened gets its later calls there
    (workers/remote.py)."""
    from workers.remote import session_queue

    queues = instance.app.amqp.queues
    if not queues.consume_from or "rollout" in queues.consume_from:
        queues.select_add(session_queue(sender))


# Metrics of a worker (apps/operations/metrics.py): its tasks' latency, the engine's own (workers/telemetry.py)
# and the sandbox pools of its host, served on STUDIO_METRICS_PORT when set. With a prefork pool the tasks run in
# child processes: set PROMETHEUS_MULTIPROC_DIR (an empty directory) for prometheus-client to gather them.
_task_started: dict[str, float] = {}


@signals.worker_init.connect
def _serve_metrics(**_):
    port = os.environ.get("STUDIO_METRICS_PORT")
    if not port:
        return
    from prometheus_client import REGISTRY, CollectorRegistry, multiprocess, start_http_server

    from apps.operations.metrics import SandboxPools

    registry = REGISTRY
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
    registry.register(SandboxPools())
    start_http_server(int(port), addr=os.environ.get("STUDIO_METRICS_ADDR", "0.0.0.0"), registry=registry)


@signals.task_prerun.connect
def _task_started_at(task_id=None, **_):
    import time

    _task_started[task_id] = time.monotonic()


@signals.task_postrun.connect
def _task_finished(task_id=None, task=None, state=None, **_):
    import time

    started = _task_started.pop(task_id, None)
    if started is not None:
        from apps.operations.metrics import CELERY_TASK_SECONDS

        CELERY_TASK_SECONDS.labels(task.name if task else "unknown", state or "unknown").observe(
            time.monotonic() - started)

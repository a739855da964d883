"""The studio's own metrics for Prometheus (prometheus-client), and its health endpoints.

- /metrics of the web process: request latency (a middleware), the Celery queue depths (read from the broker at
  scrape time), the sandbox pools of this host (the status files every pool publishes), the runs by status and
  the running runs' trainer and throughput figures (their newest metric points: trainer busy fraction, idle
  seconds by cause, tokens/s, trajectories/hour, cost), and the engine's own (workers/telemetry.py: verifier
  latency per layer, verdicts, judge calls and cost) as far as this process verified.
- A Celery worker serves the engine's metrics and its task latency on STUDIO_METRICS_PORT (studio/celery.py).
- /healthz: the process answers. /readyz: it can serve: the database answers and, on services, Redis does.

Set STUDIO_METRICS_TOKEN to require `Authorization: Bearer <token>` of the scraper; labels carry run ids and
image keys, never project or user names.
"""

from __future__ import annotations

import json
import secrets
import time
from pathlib import Path

from django.conf import settings
from django.db import connection
from django.http import HttpResponse, JsonResponse
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

QUEUES = ("gpu", "rollout", "verify", "studio")
# kombu's Redis transport keeps a queue's messages of priority p in the list "<queue>\x06\x16<p>" (p > 0).
PRIORITY_SEPARATOR = "\x06\x16"
PRIORITY_STEPS = (0, 3, 6, 9)
# The newest metric points of a running run that become gauges: name in the run's history -> (metric, labels).
RUN_POINTS = {
    "trainer/busy_fraction": "studio_trainer_busy_fraction",
    "throughput/tokens_per_second": "studio_run_generation_tokens_per_second",
    "throughput/trajectories_per_hour": "studio_run_trajectories_per_hour",
    "throughput/effective_trajectories_per_hour": "studio_run_effective_trajectories_per_hour",
    "cost/total": "studio_run_cost_total",
    "cost/per_task": "studio_run_cost_per_task",
}
POOL_STALE_SECONDS = 10  # a pool whose status file is older than this has stopped (its process is gone)

REQUEST_SECONDS = Histogram("studio_http_request_duration_seconds", "Time to answer an HTTP request",
                            ["method", "view", "status"],
                            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30))
CELERY_TASK_SECONDS = Histogram("studio_celery_task_duration_seconds", "Time a Celery task ran, by task and state",
                                ["task", "state"], buckets=(0.01, 0.05, 0.1, 0.5, 1, 5, 10, 60, 300, 1800, 7200))


class RequestMetrics:
    """Middleware: the latency of every request, labelled by the URL pattern's name (not the path, whose ids
    would make a series per object)."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        started = time.monotonic()
        response = self.get_response(request)
        match = getattr(request, "resolver_match", None)
        view = (match.view_name or match.route) if match else "unmatched"
        REQUEST_SECONDS.labels(request.method, view, str(response.status_code)).observe(time.monotonic() - started)
        return response


class CeleryQueues(Collector):
    """Messages waiting in each queue, read from the Redis broker at scrape time."""

    def collect(self):
        depth = GaugeMetricFamily("studio_celery_queue_depth", "Messages waiting in a Celery queue", labels=["queue"])
        url = settings.CELERY_BROKER_URL
        if url.startswith(("redis://", "rediss://")):
            import redis

            client = redis.Redis.from_url(url, socket_timeout=2)
            try:
                for queue in QUEUES:
                    names = [queue] + [f"{queue}{PRIORITY_SEPARATOR}{p}" for p in PRIORITY_STEPS if p]
                    depth.add_metric([queue], sum(client.llen(name) for name in names))
            except redis.RedisError:
                pass  # /readyz says the broker is down; a scrape still answers with the rest
            finally:
                client.close()
        yield depth


class SandboxPools(Collector):
    """The sandbox pools running on this host, from the status file each publishes every second."""

    def collect(self):
        labels = ["image", "pid"]
        families = {name: GaugeMetricFamily(f"studio_sandbox_pool_{name}", text, labels=labels) for name, text in [
            ("warm", "Idle sandboxes ready for a call"), ("busy", "Sandboxes running a call"),
            ("starting", "Sandboxes being started"), ("waiting", "Callers waiting for a sandbox"),
        ]}
        wait = GaugeMetricFamily("studio_sandbox_wait_seconds", "Recent wait for a sandbox, by quantile",
                                 labels=[*labels, "quantile"])
        now = time.time()
        for path in sorted(Path(settings.SANDBOX_STATUS_DIR).glob("pool-*.json")):
            try:
                status = json.loads(path.read_text())
            except (OSError, ValueError):
                continue  # being replaced, or gone
            if now - status.get("updated", 0) > POOL_STALE_SECONDS:
                continue
            for image in status.get("images", []):
                key = [image["image"], str(status["pid"])]
                for name, family in families.items():
                    family.add_metric(key, image.get(name, 0))
                for quantile, seconds in _quantiles(image.get("wait_for_sandbox")):
                    wait.add_metric([*key, quantile], seconds)
        yield from families.values()
        yield wait


class Runs(Collector):
    """Runs by status, and each running run's newest trainer and throughput figures (from the database)."""

    def collect(self):
        from django.db.models import Count, Max

        from apps.runs.models import MetricPoint, Run, RunStatus

        by_status = GaugeMetricFamily("studio_runs", "Runs by status", labels=["status"])
        counts = dict(Run.objects.values_list("status").annotate(n=Count("id")))
        for status in RunStatus.values:
            by_status.add_metric([status], counts.get(status, 0))
        yield by_status
        step = GaugeMetricFamily("studio_run_step", "Trainer steps completed", labels=["run"])
        points = {name: GaugeMetricFamily(metric, f"The running run's newest {name}", labels=["run"])
                  for name, metric in RUN_POINTS.items()}
        idle = GaugeMetricFamily("studio_trainer_idle_seconds", "Seconds the trainer waited, by cause",
                                 labels=["run", "cause"])
        running = {str(pk): steps for pk, steps in Run.objects.filter(status=RunStatus.RUNNING)
                   .values_list("pk", "step")}
        for run, steps in running.items():
            step.add_metric([run], steps)
        newest = (MetricPoint.objects.filter(run_id__in=list(running)).values("run_id", "name")
                  .annotate(step=Max("step")))
        wanted = {(str(row["run_id"]), row["name"], row["step"]) for row in newest
                  if row["name"] in RUN_POINTS or row["name"].startswith("idle/")}
        if wanted:
            rows = MetricPoint.objects.filter(run_id__in=list(running), step__in={w[2] for w in wanted}).values_list(
                "run_id", "name", "step", "value")
            for run_id, name, at, value in rows:
                if (str(run_id), name, at) not in wanted:
                    continue
                if name.startswith("idle/"):
                    idle.add_metric([str(run_id), name.removeprefix("idle/")], value)
                else:
                    points[name].add_metric([str(run_id)], value)
        yield step
        yield idle
        yield from points.values()


def _quantiles(summary) -> list[tuple[str, float]]:
    """workers.sandbox.pool.latency_summary ({p50_ms, p95_ms, count}) as (quantile, seconds)."""
    if not isinstance(summary, dict):
        return []
    return [(quantile, summary[key] / 1000) for quantile, key in (("0.5", "p50_ms"), ("0.95", "p95_ms"))
            if isinstance(summary.get(key), int | float)]


# What only the web process exposes: read from the database and the broker, it would be the same from every
# process, so it is scraped once. The process's own metrics (REGISTRY: requests, the engine's) come with it.
WEB = CollectorRegistry()  # no auto_describe: registering must not read the database (imports run before it is there)
for _collector in (CeleryQueues(), SandboxPools(), Runs()):
    WEB.register(_collector)


def metrics(request):
    token = settings.METRICS_TOKEN
    if token and not secrets.compare_digest(request.headers.get("Authorization", ""), f"Bearer {token}"):
        return HttpResponse("A bearer token is required (STUDIO_METRICS_TOKEN).\n", status=401,
                            content_type="text/plain", headers={"WWW-Authenticate": 'Bearer realm="metrics"'})
    return HttpResponse(generate_latest(REGISTRY) + generate_latest(WEB), content_type=CONTENT_TYPE_LATEST)


def healthz(request):
    return JsonResponse({"status": "ok"})


def readyz(request):
    checks = {}
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        checks["database"] = "ok"
    except Exception as exc:  # any failure means not ready; say which
        checks["database"] = f"error: {type(exc).__name__}: {exc}"
    if settings.REDIS_URL:
        import redis

        try:
            client = redis.Redis.from_url(settings.REDIS_URL, socket_timeout=2)
            client.ping()
            client.close()
            checks["redis"] = "ok"
        except redis.RedisError as exc:
            checks["redis"] = f"error: {type(exc).__name__}: {exc}"
    ready = all(value == "ok" for value in checks.values())
    return JsonResponse({"status": "ready" if ready else "not ready", "checks": checks}, status=200 if ready else 503)

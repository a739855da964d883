"""/metrics, /healthz and /readyz of the web process: what a Prometheus scrape reads while the studio works —
request latency, the running run's trainer and throughput figures, the sandbox pools, the verifier's layers,
the Celery queue depths — and the health answers an orchestrator acts on."""

import json
import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

from apps.runs.models import MetricPoint
from workers.definitions.specs import parse_spec
from workers.verifiers import Item, Sample, verify

pytestmark = pytest.mark.django_db


def scrape(client, **headers) -> dict[tuple[str, tuple], float]:
    response = client.get("/metrics", **headers)
    assert response.status_code == 200 and response["Content-Type"].startswith("text/plain")
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(response.content.decode()) for sample in family.samples}


def value(samples, name, **labels) -> float | None:
    return next((v for (n, ls), v in samples.items() if n == name and set(labels.items()) <= set(ls)), None)


def test_a_scrape_shows_requests_the_running_run_the_pools_and_the_verifier(client, login, owner, project,
                                                                            studio_run, settings):
    run, _ = studio_run
    MetricPoint.objects.update_or_create(run=run, name="idle/verification", step=run.step,
                                         defaults={"wall_time": time.time(), "value": 12.5})
    login(owner).get(f"/p/{project.slug}/registry/")
    pools = settings.SANDBOX_STATUS_DIR
    pools.mkdir(parents=True, exist_ok=True)
    (pools / "pool-4242-1.json").write_text(json.dumps({"pid": 4242, "backend": "process", "updated": time.time(),
        "images": [{"image": "sandbox_image/py@1", "warm": 3, "busy": 1, "starting": 0, "waiting": 2,
                    "wait_for_sandbox": {"p50_ms": 12.0, "p95_ms": 80.0, "count": 9}}]}))
    (pools / "pool-99-1.json").write_text(json.dumps({"pid": 99, "updated": time.time() - 3600, "images": [
        {"image": "sandbox_image/gone@1", "warm": 5}]}))  # a pool whose process stopped an hour ago
    spec = parse_spec("verifier", {"layers": [{"name": "exact", "kind": "exact", "checks": [
        {"type": "numeric", "name": "n", "weight": 1.0, "reference": "{answer}", "abs_tolerance": 0,
         "rel_tolerance": 0, "parse_scale": False}]}], "pass_threshold": 1.0})
    before = value(scrape(client), "studio_verdicts_total", deciding_layer_kind="exact", status="pass") or 0
    verify(spec, Sample(response="4"), Item(key="k", inputs={}, hidden={"answer": 4}), None)

    samples = scrape(client)
    assert value(samples, "studio_http_request_duration_seconds_count", view="registry:definition_list",
                 method="GET", status="200") >= 1
    assert value(samples, "studio_runs", status="running") == 1
    assert value(samples, "studio_run_step", run=str(run.pk)) == run.step
    busy = MetricPoint.objects.get(run=run, name="trainer/busy_fraction", step=run.step).value
    assert value(samples, "studio_trainer_busy_fraction", run=str(run.pk)) == pytest.approx(busy)
    assert value(samples, "studio_trainer_idle_seconds", run=str(run.pk), cause="verification") == 12.5
    assert value(samples, "studio_sandbox_pool_warm", image="sandbox_image/py@1", pid="4242") == 3
    assert value(samples, "studio_sandbox_pool_waiting", image="sandbox_image/py@1") == 2
    assert value(samples, "studio_sandbox_wait_seconds", image="sandbox_image/py@1", quantile="0.95") == 0.08
    assert value(samples, "studio_sandbox_pool_warm", image="sandbox_image/gone@1") is None
    assert value(samples, "studio_verdicts_total", deciding_layer_kind="exact", status="pass") == before + 1
    assert value(samples, "studio_verifier_layer_seconds_count", layer_kind="exact") >= 1


def test_a_metrics_token_is_required_when_set(client, settings):
    settings.METRICS_TOKEN = "s3cret"
    assert client.get("/metrics").status_code == 401
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer wrong").status_code == 401
    scrape(client, HTTP_AUTHORIZATION="Bearer s3cret")


def test_health_and_readiness(client, settings):
    assert client.get("/healthz").json() == {"status": "ok"}
    settings.REDIS_URL = ""
    assert client.get("/readyz").json() == {"status": "ready", "checks": {"database": "ok"}}
    settings.REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens there
    answer = client.get("/readyz")
    assert answer.status_code == 503 and answer.json()["checks"]["redis"].startswith("error:")


@pytest.mark.redis
def test_the_queue_depths_are_read_from_the_broker(client, settings):
    import redis

    settings.CELERY_BROKER_URL = "redis://127.0.0.1:6379/14"  # a database of its own: no worker takes these
    broker = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    # Another process on this Redis (a developer's worker, an earlier run) may have left messages in that database:
    # the queues read here start empty.
    for queue in ("rollout", "gpu"):
        broker.delete(queue, *broker.keys(f"{queue}\x06\x16*"))
    broker.lpush("rollout", "a", "b")
    broker.lpush("rollout\x06\x163", "c")  # a message of priority 3
    try:
        samples = scrape(client)
    finally:
        broker.delete("rollout", "rollout\x06\x163")
    assert value(samples, "studio_celery_queue_depth", queue="rollout") == 3
    assert value(samples, "studio_celery_queue_depth", queue="gpu") == 0

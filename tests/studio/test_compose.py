"""The deployment files. docker-compose.yml cannot run here, but it must be valid for Docker Compose, describe the
topology the README's "Production" section promises (a scalable rollout and verify tier, every studio process on
the same settings and the object store), and stay true to the code: the entry points it names exist and every
setting it passes is one the studio (or the AWS SDK under s3fs) reads. The Prometheus config scrapes every studio
process; the Kubernetes manifests run the same processes."""

import importlib
import re
import subprocess

import pytest
import yaml

from tests.support import ROOT
from tests.support.resources import compose_command

COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
STUDIO_SERVICES = {"web", "gpu", "rollout", "verify", "studio-worker", "beat"}
WORKERS = {"gpu": "gpu", "rollout": "rollout", "verify": "verify", "studio-worker": "studio"}


def test_compose_has_the_topology_and_every_studio_process_shares_one_environment():
    services = COMPOSE["services"]
    assert set(services) == STUDIO_SERVICES | {"postgres", "redis", "objectstore", "prometheus"}
    assert all(services[name]["environment"] == services["web"]["environment"] for name in STUDIO_SERVICES)
    assert services["web"]["environment"]["STUDIO_STORAGE_URL"].startswith("s3://")
    for name in ("rollout", "verify"):  # `--scale NAME=N` needs no fixed name and no host port
        assert "container_name" not in services[name] and not services[name].get("ports")


def test_web_serves_the_asgi_application_it_names():
    command = COMPOSE["services"]["web"]["command"]
    module, attribute = re.search(r"daphne .* ([\w.]+):(\w+)", command).groups()
    assert hasattr(importlib.import_module(module), attribute)
    assert "manage.py migrate" in command


def test_workers_use_the_celery_app_and_queues_of_the_code():
    from django.conf import settings

    routed = {route["queue"] for route in settings.CELERY_TASK_ROUTES.values()} | {"studio"}
    for name, queue in WORKERS.items():
        command = COMPOSE["services"][name]["command"]
        app_module = re.search(r"-A (\S+)", command).group(1)
        assert importlib.import_module(app_module).celery_app.main == "studio"
        assert set(re.search(r"--queues=(\S+)", command).group(1).split(",")) == {queue} <= routed


def test_every_environment_variable_is_read_by_the_settings():
    read = (ROOT / "studio" / "settings.py").read_text() + (ROOT / "studio" / "celery.py").read_text()
    for name in COMPOSE["services"]["web"]["environment"]:
        if name.startswith("AWS_"):  # the AWS SDK's own variables: s3fs (botocore) reads them
            continue
        assert f'"{name}"' in read, f"{name} is set in docker-compose.yml but never read"
    database_url = COMPOSE["services"]["web"]["environment"]["DATABASE_URL"]
    postgres = COMPOSE["services"]["postgres"]["environment"]
    assert database_url == (f"postgres://{postgres['POSTGRES_USER']}:{postgres['POSTGRES_PASSWORD']}"
                            f"@postgres:5432/{postgres['POSTGRES_DB']}")


def test_dockerfile_copies_what_the_processes_need():
    dockerfile = (ROOT / "Dockerfile").read_text()
    for folder in ["studio", "apps", "workers", "templates", "static"]:
        assert f"COPY {folder} {folder}" in dockerfile


@pytest.mark.compose
def test_docker_compose_config_is_valid_and_has_the_topology(tmp_path):
    env = tmp_path / "compose.env"
    env.write_text("SECRET_KEY=only-for-this-test\n")
    answer = subprocess.run([*compose_command(), "--env-file", str(env), "-f", str(ROOT / "docker-compose.yml"),
                             "config"], capture_output=True, text=True, cwd=ROOT)
    assert answer.returncode == 0, answer.stderr
    config = yaml.safe_load(answer.stdout)
    services = config["services"]
    assert STUDIO_SERVICES | {"postgres", "redis", "objectstore", "prometheus"} <= set(services)
    assert all(services[name]["environment"] == services["web"]["environment"] for name in STUDIO_SERVICES)


def test_prometheus_scrapes_the_web_process_and_every_worker():
    config = yaml.safe_load((ROOT / "deploy" / "prometheus.yml").read_text())
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert jobs["studio-web"]["static_configs"][0]["targets"] == ["web:8000"]
    workers = jobs["studio-workers"]["dns_sd_configs"][0]
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    assert set(workers["names"]) == STUDIO_SERVICES - {"web", "beat"}
    assert str(workers["port"]) == compose["x-studio-env"]["STUDIO_METRICS_PORT"]


def test_the_kubernetes_manifests_run_the_same_processes_on_the_same_settings():
    documents = list(yaml.safe_load_all((ROOT / "deploy" / "k8s" / "studio.yaml").read_text()))
    deployments = {d["metadata"]["name"]: d for d in documents if d["kind"] == "Deployment"}
    assert set(deployments) == STUDIO_SERVICES
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    for name, deployment in deployments.items():
        container = deployment["spec"]["template"]["spec"]["containers"][0]
        assert {"configMapRef": {"name": "studio-config"}} in container["envFrom"], name
        if name != "web":  # the same Celery command as the compose service
            assert " ".join(container["command"]) == compose["services"][name]["command"], name
    web = deployments["web"]["spec"]["template"]["spec"]["containers"][0]
    assert web["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert web["readinessProbe"]["httpGet"]["path"] == "/readyz"
    config = next(d for d in documents if d["kind"] == "ConfigMap")["data"]
    assert set(config) >= {"STUDIO_STORAGE_URL", "REDIS_URL", "STUDIO_METRICS_PORT"}

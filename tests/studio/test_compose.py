"""docker-compose.yml cannot run here, but it must stay true to the code: the entry points it names exist and
every setting it passes is one the studio reads."""

import importlib
import re

import yaml

from tests.support import ROOT

COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def test_compose_has_the_four_services_and_web_worker_share_one_environment():
    services = COMPOSE["services"]
    assert set(services) == {"postgres", "redis", "web", "worker"}
    assert services["web"]["environment"] == services["worker"]["environment"]


def test_web_serves_the_asgi_application_it_names():
    command = COMPOSE["services"]["web"]["command"]
    module, attribute = re.search(r"daphne .* ([\w.]+):(\w+)", command).groups()
    assert hasattr(importlib.import_module(module), attribute)
    assert "manage.py migrate" in command


def test_worker_uses_the_celery_app_and_queues_of_the_code():
    command = COMPOSE["services"]["worker"]["command"]
    app_module = re.search(r"-A (\S+)", command).group(1)
    assert importlib.import_module(app_module).celery_app.main == "studio"
    queues = set(re.search(r"--queues=(\S+)", command).group(1).split(","))
    assert queues <= {"gpu", "rollout", "verify"}


def test_every_environment_variable_is_read_by_the_settings():
    settings_source = (ROOT / "studio" / "settings.py").read_text()
    for name in COMPOSE["services"]["web"]["environment"]:
        assert f'"{name}"' in settings_source, f"{name} is set in docker-compose.yml but never read"
    database_url = COMPOSE["services"]["web"]["environment"]["DATABASE_URL"]
    postgres = COMPOSE["services"]["postgres"]["environment"]
    assert database_url == (f"postgres://{postgres['POSTGRES_USER']}:{postgres['POSTGRES_PASSWORD']}"
                            f"@postgres:5432/{postgres['POSTGRES_DB']}")


def test_dockerfile_copies_what_the_processes_need():
    dockerfile = (ROOT / "Dockerfile").read_text()
    for folder in ["studio", "apps", "workers", "templates", "static"]:
        assert f"COPY {folder} {folder}" in dockerfile

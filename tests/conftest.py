"""Shared fixtures. Tests use the real database named by DATABASE_URL (SQLite by default, PostgreSQL in CI)."""

import pytest
from django.contrib.auth import get_user_model
from django.db import connection

from apps.accounts.models import Role
from apps.accounts.services import membership_set, project_create


def pytest_collection_modifyitems(config, items):
    """Tests marked `postgres` need the real server; elsewhere they are skipped and -ra says why."""
    if connection.vendor == "postgresql":
        return
    skip = pytest.mark.skip(reason="needs PostgreSQL: set DATABASE_URL=postgres://... (CI does)")
    for item in items:
        if "postgres" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def make_user(db):
    def make(username: str, password: str = "pw-for-tests"):
        return get_user_model().objects.create_user(username=username, password=password)

    return make


@pytest.fixture
def owner(make_user):
    return make_user("olive")


@pytest.fixture
def project(owner):
    return project_create(team_slug="acme", slug="acme-rl", name="Acme RL", owner=owner)


@pytest.fixture
def member(project, make_user, owner):
    """member("viewer") -> a user holding that role in `project`."""

    def make(role: str):
        user = make_user(f"{role}-user")
        membership_set(project=project, user=user, role=role, actor=owner)
        return user

    return make


@pytest.fixture
def outsider(make_user):
    """Owner of another project, member of none of ours."""
    user = make_user("mallory")
    project_create(team_slug="other", slug="other-team", name="Other", owner=user)
    return user


__all__ = ["Role"]


# --- a small but complete registry: image, verifier, task template with instances, domain, bundle ----------

IMAGE_SPEC = {"layers": [{"type": "base", "image": "python-3.11"},
                         {"type": "python_packages", "packages": ["numpy==2.1.3"]}],
              "limits": {"memory_mb": 256}, "warm_pool_size": 2}
VERIFIER_SPEC = {"layers": [
    {"name": "exact", "kind": "exact", "checks": [{"type": "numeric", "reference": "{answer}"}],
     "escalate": {"uncertain_low": 0.2, "uncertain_high": 0.8}},
    {"name": "judge", "kind": "judge", "checks": [{"type": "score_model", "model": "judge-small",
                                                     "rubric": "Is the arithmetic right?"}]},
]}
TEMPLATE_SPEC = {"prompt_template": "What is {a} + {b}?", "sandbox_image": "py-basic", "verifier": "numeric",
                 "limits": {"max_turns": 1, "max_tokens": 16, "max_seconds": 10}}
DOMAIN_SPEC = {"sampling_weight": 2.0, "templates": [{"template": "add-two", "weight": 1.0}]}


def addition_instances(n: int = 20) -> list[dict]:
    return [{"key": f"add-{i:05d}", "inputs": {"a": i, "b": i % 7}, "hidden": {"answer": i + i % 7}}
            for i in range(n)]


@pytest.fixture
def registry(project, owner):
    """Publishes one definition of each kind in `project`; returns their versions by kind."""
    from apps.registry.services import version_publish

    def publish(kind, slug, spec, **extra):
        return version_publish(project=project, kind=kind, slug=slug, spec=spec, author=owner, **extra).version

    return {
        "sandbox_image": publish("sandbox_image", "py-basic", IMAGE_SPEC),
        "verifier": publish("verifier", "numeric", VERIFIER_SPEC),
        "task_template": publish("task_template", "add-two", TEMPLATE_SPEC, instances=addition_instances()),
        "domain": publish("domain", "arithmetic", DOMAIN_SPEC, description="Exact-answer arithmetic"),
        "bundle": publish("bundle", "arith-bundle", {"members": ["domain/arithmetic@latest"]}),
    }

"""Shared fixtures. Tests use the real database named by DATABASE_URL (SQLite by default, PostgreSQL in CI)."""

import pytest
from django.contrib.auth import get_user_model
from django.db import connection

from apps.accounts.services import membership_set, project_create
from specimens import DOMAIN_SPEC, IMAGE_SPEC, TEMPLATE_SPEC, VERIFIER_SPEC, addition_instances


def pytest_collection_modifyitems(config, items):
    """Tests marked `postgres` need the real server; elsewhere they are skipped and -ra says why."""
    if connection.vendor == "postgresql":
        return
    skip = pytest.mark.skip(reason="needs PostgreSQL: set DATABASE_URL=postgres://... (CI does)")
    for item in items:
        if "postgres" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def fast_password_hashing(settings):
    # Tests create many users; the production hasher is deliberately slow.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


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



# --- a small but complete registry: image, verifier, task template with instances, domain, bundle ----------

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

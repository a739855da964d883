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

"""Fixtures for the web pages: a logged-in client per role, and the URLs of the registry's pages."""

import pytest
from django.urls import reverse


@pytest.fixture
def login(client):
    """login(user) -> the test client, logged in as user."""

    def as_user(user):
        client.force_login(user)
        return client

    return as_user


@pytest.fixture
def registry_pages(project, registry):
    """Every registry page of `project`, each as (method, url): what access tests must walk."""
    verifier = {"project": project.slug, "kind": "verifier", "slug": "numeric"}
    return [
        ("get", reverse("registry:definition_list", kwargs={"project": project.slug})),
        ("get", reverse("registry:definition_create", kwargs={"project": project.slug})),
        ("post", reverse("registry:definition_create", kwargs={"project": project.slug})),
        ("get", reverse("registry:definition_detail", kwargs=verifier)),
        ("get", reverse("registry:version_detail", kwargs={**verifier, "number": 1})),
        ("get", reverse("registry:version_diff", kwargs=verifier) + "?a=1&b=1"),
        ("get", reverse("registry:version_edit", kwargs=verifier)),
        ("post", reverse("registry:version_edit", kwargs=verifier)),
        ("post", reverse("registry:alias_set", kwargs=verifier)),
    ]

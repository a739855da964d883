"""The URLs of the registry's pages, for the tests that walk all of them."""

import pytest
from django.urls import reverse


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
        ("post", reverse("registry:spec_validate", kwargs={"project": project.slug})),
        ("get", reverse("task_import:task_upload", kwargs={**verifier, "kind": "task_template", "slug": "add-two"})),
        ("post", reverse("task_import:task_upload", kwargs={**verifier, "kind": "task_template", "slug": "add-two"})),
        ("get", reverse("authoring:verifier_playground", kwargs={"project": project.slug, "slug": "numeric"})),
        ("post", reverse("authoring:verifier_playground", kwargs={"project": project.slug, "slug": "numeric"})),
        ("get", reverse("authoring:template_playground", kwargs={"project": project.slug, "slug": "add-two"})),
        ("post", reverse("authoring:template_playground", kwargs={"project": project.slug, "slug": "add-two"})),
    ]

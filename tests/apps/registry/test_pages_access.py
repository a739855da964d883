"""Who sees what: anonymous visitors log in first, other projects' members see nothing, viewers only read."""

import yaml
from django.urls import reverse

from apps.accounts.services import project_create
from apps.registry.models import Alias, Definition, Version


def test_anonymous_is_sent_to_login_from_every_page(client, registry_pages):
    versions = Version.objects.count()
    for method, url in [*registry_pages, ("get", "/"), ("get", reverse("api_tokens"))]:
        response = getattr(client, method)(url, {"spec": "x: 1", "message": "m", "expected_head": 1}
                                           if method == "post" else None)
        assert response.status_code == 302, url
        assert response["Location"].startswith("/accounts/login/?next="), url
    assert Version.objects.count() == versions


def test_outsider_gets_404_on_every_page_of_the_project(login, outsider, registry_pages):
    client = login(outsider)
    versions = Version.objects.count()
    for method, url in registry_pages:
        response = getattr(client, method)(url, {"name": "prod", "number": 1} if method == "post" else None)
        assert response.status_code == 404, url
        # The same answer as for a project that does not exist: nothing says the project is there.
        assert b"No project &#x27;acme-rl&#x27;" in response.content, url
    assert Version.objects.count() == versions
    assert not Alias.objects.exists()


def test_viewer_cannot_edit_and_nothing_is_published(login, member, project, registry):
    client = login(member("viewer"))
    verifier = {"project": project.slug, "kind": "verifier", "slug": "numeric"}
    edit = reverse("registry:version_edit", kwargs=verifier)
    spec = {**registry["verifier"].spec, "pass_threshold": 0.5}

    assert client.get(edit).status_code == 403
    response = client.post(edit, {"spec": yaml.safe_dump(spec), "message": "lower the bar", "expected_head": 1})
    assert response.status_code == 403
    assert b"this needs editor or above" in response.content
    assert Version.objects.filter(definition__slug="numeric").count() == 1

    new = reverse("registry:definition_create", kwargs={"project": project.slug})
    assert client.post(new, {"kind": "verifier", "slug": "copy", "spec": yaml.safe_dump(spec),
                             "message": "m"}).status_code == 403
    assert not Definition.objects.filter(slug="copy").exists()
    alias = reverse("registry:alias_set", kwargs=verifier)
    assert client.post(alias, {"name": "prod", "number": 1}).status_code == 403
    assert not Alias.objects.exists()


def test_viewer_and_reviewer_see_no_edit_controls(login, member, owner, project, registry):
    detail = reverse("registry:definition_detail", kwargs={"project": project.slug, "kind": "verifier",
                                                           "slug": "numeric"})
    edit = reverse("registry:version_edit", kwargs={"project": project.slug, "kind": "verifier", "slug": "numeric"})
    for role in ("viewer", "reviewer"):
        page = login(member(role)).get(detail)
        assert page.status_code == 200
        assert edit.encode() not in page.content
        assert b"Point alias here" not in page.content
    page = login(owner).get(detail)
    assert edit.encode() in page.content
    assert b"Point alias here" in page.content


def test_home_goes_to_the_first_project_or_says_there_is_none(login, make_user, owner, project):
    response = login(owner).get("/")
    assert response.status_code == 302
    assert response["Location"] == reverse("registry:definition_list", kwargs={"project": project.slug})

    response = login(make_user("newcomer")).get("/")
    assert response.status_code == 200
    assert b"not in any project" in response.content


def test_login_and_logout(client, owner, project):
    page = client.get(reverse("login"))
    assert page.status_code == 200
    assert b'name="password"' in page.content

    wrong = client.post(reverse("login"), {"username": "olive", "password": "nope"})
    assert wrong.status_code == 200 and b"enter a correct username and password" in wrong.content

    response = client.post(reverse("login"), {"username": "olive", "password": "pw-for-tests", "next": "/"})
    assert response.status_code == 302
    assert client.get("/").status_code == 302  # logged in: home redirects to the project, not to login
    assert client.get(reverse("registry:definition_list", kwargs={"project": project.slug})).status_code == 200

    assert client.post(reverse("logout")).status_code == 302
    assert client.get("/")["Location"].startswith("/accounts/login/")


def test_project_switcher_lists_only_the_users_projects(login, owner, outsider, project):
    project_create(team_slug="acme", slug="acme-evals", name="Acme Evals", owner=owner)
    page = login(owner).get(reverse("registry:definition_list", kwargs={"project": project.slug}))
    assert b'href="/p/acme-evals/registry/"' in page.content
    assert b'href="/p/acme-rl/registry/" class="current"' in page.content
    assert b"other-team" not in page.content

"""The explorer's page, which Dash draws, carries the studio's navigation: the same links as every other page of
the project, the viewer's projects and name, and a logout form."""

import re

from django.urls import reverse


def navigation(html: str) -> str:
    return re.search(r'<nav class="topnav">.*?</nav>', html, re.S)[0]


def test_the_explorer_has_the_studios_navigation(login, owner, project, studio_run):
    client = login(owner)
    explorer = client.get(reverse("explorer:index", kwargs={"project": project.slug}))
    assert explorer.status_code == 200
    runs_page = client.get(reverse("runs:run_list", kwargs={"project": project.slug}))
    links = re.compile(r'href="([^"]+)"')
    ours = navigation(explorer.content.decode())
    assert links.findall(ours) == links.findall(navigation(runs_page.content.decode()))
    assert reverse("audit_log", kwargs={"project": project.slug}) in ours and "olive" in ours
    assert 'action="/accounts/logout/"' in ours and 'name="csrfmiddlewaretoken"' in ours


def test_a_renamed_project_gets_an_explorer_at_its_new_address(login, owner, project, studio_run):
    """The explorer app is kept per project; one built for the old slug routes only the old slug's paths."""
    client = login(owner)
    assert client.get(reverse("explorer:index", kwargs={"project": project.slug})).status_code == 200
    project.slug, project.name = "renamed", "Renamed"
    project.save(update_fields=["slug", "name"])
    page = client.get(reverse("explorer:index", kwargs={"project": "renamed"}))
    assert page.status_code == 200 and "Explorer · Renamed" in page.content.decode()

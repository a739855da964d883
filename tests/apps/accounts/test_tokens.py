"""API tokens: the plaintext is shown once, only its digest is stored, a token is for one project of its
holder's, and revoking one is final."""

import hashlib
import re

from django.urls import reverse

from apps.accounts.models import ApiToken
from apps.accounts.selectors import token_for_plaintext
from apps.accounts.services import api_token_create


def holder(plaintext: str):
    token = token_for_plaintext(plaintext=plaintext)
    return None if token is None else token.user


def test_created_token_is_shown_once_and_stored_as_a_digest(login, owner, project):
    client = login(owner)
    page = client.post(reverse("api_tokens"), {"name": "laptop CLI", "project": project.pk, "scope": "review"})
    assert page.status_code == 200
    plaintext = re.search(r'<code class="secret">(pts_[0-9a-f]{8}_[\w-]+)</code>', page.content.decode())[1]

    token = ApiToken.objects.get(user=owner, name="laptop CLI")
    assert token.digest == hashlib.sha256(plaintext.encode()).hexdigest()
    stored = [str(v) for v in ApiToken.objects.filter(pk=token.pk).values().first().values()]
    assert not any(plaintext in v or plaintext.split("_", 2)[2] in v for v in stored)
    assert holder(plaintext) == owner and (token.project, token.scope, token.expires_at) == (project, "review", None)

    again = client.get(reverse("api_tokens"))
    assert plaintext.encode() not in again.content
    assert b"laptop CLI" in again.content
    assert f"pts_{token.prefix}_".encode() in again.content


def test_a_token_needs_a_name_and_a_project_of_its_holders(login, owner, project, outsider):
    client = login(owner)
    assert client.post(reverse("api_tokens"), {"name": "", "project": project.pk, "scope": "read"}).status_code == 400
    others = outsider.memberships.get().project
    assert client.post(reverse("api_tokens"), {"name": "x", "project": others.pk, "scope": "read"}).status_code == 400
    assert not ApiToken.objects.exists()


def test_revoke_stops_the_token(login, owner, project):
    token, plaintext = api_token_create(user=owner, name="ci", project=project)
    response = login(owner).post(reverse("api_token_revoke", kwargs={"token_id": token.pk}))
    assert response.status_code == 302
    token.refresh_from_db()
    assert token.revoked_at is not None
    assert holder(plaintext) is None


def test_nobody_revokes_another_users_token(login, owner, project, outsider):
    token, plaintext = api_token_create(user=owner, name="ci", project=project)
    client = login(outsider)
    assert client.post(reverse("api_token_revoke", kwargs={"token_id": token.pk})).status_code == 404
    assert b"ci" not in client.get(reverse("api_tokens")).content.split(b"<h2>Your tokens</h2>")[1]
    assert holder(plaintext) == owner


def test_the_tokens_page_keeps_the_projects_navigation_and_preselects_an_expiry(login, owner, project, outsider):
    client = login(owner)
    runs = reverse("runs:run_list", kwargs={"project": project.slug})
    registry_page = client.get(reverse("registry:definition_list", kwargs={"project": project.slug})).content.decode()
    tokens_link = re.search(r'href="([^"]*/accounts/tokens/[^"]*)"', registry_page)[1]
    page = client.get(tokens_link.replace("&amp;", "&"))
    assert page.status_code == 200
    html = page.content.decode()
    assert f'href="{runs}"' in html  # the project's navigation, as on its other pages
    assert re.search(r'<option value="90" selected>in 90 days</option>', html)
    assert re.search(rf'<option value="{project.pk}" selected>', html)
    # Never expiring is still a choice, as the service allows.
    client.post(tokens_link, {"name": "forever", "project": project.pk, "scope": "read", "expires": ""})
    assert ApiToken.objects.get(name="forever").expires_at is None
    # Opened on its own, the page draws the user's first project's navigation; another team's project is a 404.
    assert f'href="{runs}"' in client.get(reverse("api_tokens")).content.decode()
    others = outsider.memberships.get().project
    assert client.get(reverse("api_tokens"), {"project": others.slug}).status_code == 404


def test_an_environment_token_is_made_by_an_editor_and_reads_the_api_as_a_viewer(login, api_as, owner, member,
                                                                                  project, registry):
    """The scope `manage.py environments serve` admits (tests/apps/environments): its episodes become runs, so only
    an editor or an owner makes one; handed to a training cluster, it writes nothing through the API."""
    page = login(owner).post(reverse("api_tokens"), {"name": "cluster", "project": project.pk, "scope": "environment",
                                                     "expires": "30"})
    assert page.status_code == 200 and ApiToken.objects.get(name="cluster").scope == "environment"
    refused = login(member("viewer")).post(reverse("api_tokens"), {"name": "mine", "project": project.pk,
                                                                   "scope": "environment", "expires": "30"})
    assert refused.status_code == 400 and "needs an editor or an owner" in refused.content.decode()
    assert not ApiToken.objects.filter(name="mine").exists()

    cluster = api_as(owner, project=project, scope="environment")
    assert [(p["slug"], p["role"]) for p in cluster.get("/projects").json()] == [("acme-rl", "viewer")]
    write = cluster.post("/projects/acme-rl/definitions/verifier/numeric/versions",
                         {"spec": {**registry["verifier"].spec, "pass_threshold": 0.5}, "message": "m"})
    assert write.status_code == 403 and "scope is environment" in write.json()["detail"]

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

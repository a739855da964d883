"""Who may call the API: a live API token (one project, a scope, maybe an expiry) or a signed-in browser
session, nothing else."""

import json

import pytest
from django.test import Client

from apps.accounts.models import ApiToken
from apps.accounts.services import api_token_revoke
from apps.registry.models import Version
from tests.support.specimens import VERIFIER_SPEC

PUBLISH = "/api/v1/projects/acme-rl/definitions/verifier/numeric/versions"
CHANGED = {**VERIFIER_SPEC, "pass_threshold": 0.5}


def assert_401(response, mentions: str):
    assert response.status_code == 401
    assert response["Content-Type"] == "application/json; charset=utf-8"
    assert mentions in response.json()["detail"]
    assert response["WWW-Authenticate"].startswith("Bearer")


def test_no_credentials_is_401_json(api_as, project):
    assert_401(api_as(None).get("/projects"), "Authorization: Bearer")
    assert_401(api_as(None).get("/projects/acme-rl/definitions"), "Authorization: Bearer")


@pytest.mark.parametrize("header", ["Bearer pts_00000000_not-a-real-token", "Bearer not-even-a-pts-token", "Bearer "])
def test_unknown_token_is_401(client, project, header):
    assert_401(client.get("/api/v1/projects", HTTP_AUTHORIZATION=header), "unknown, expired or revoked")


def test_revoked_token_is_401(api_as, owner, project):
    api = api_as(owner)
    assert api.get("/projects").status_code == 200
    api_token_revoke(token=ApiToken.objects.get(user=owner), actor=owner)
    assert_401(api.get("/projects"), "revoked")


def test_token_of_deactivated_user_is_401(api_as, owner, project):
    api = api_as(owner)
    owner.is_active = False
    owner.save()
    assert_401(api.get("/projects"), "revoked")


def test_token_marks_its_last_use(api_as, owner, project):
    api_as(owner).get("/projects")
    assert ApiToken.objects.get(user=owner).last_used_at is not None


def test_a_bad_token_is_not_rescued_by_the_session(client, owner, project):
    client.force_login(owner)
    assert client.get("/api/v1/projects").status_code == 200
    response = client.get("/api/v1/projects", HTTP_AUTHORIZATION="Bearer pts_dead_beef")
    assert_401(response, "revoked")


def test_session_reads_and_writes_with_csrf(owner, registry):
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(owner)
    assert [p["slug"] for p in browser.get("/api/v1/projects").json()] == ["acme-rl"]

    body = json.dumps({"spec": CHANGED, "message": "looser"})
    refused = browser.post(PUBLISH, body, content_type="application/json")
    assert refused.status_code == 403 and "CSRF" in refused.json()["detail"]
    assert Version.objects.filter(definition__slug="numeric").count() == 1

    token = "a" * 32  # what a page would have set as the CSRF cookie
    browser.cookies["csrftoken"] = token
    created = browser.post(PUBLISH, body, content_type="application/json", HTTP_X_CSRFTOKEN=token)
    assert created.status_code == 201, created.json()


def test_anonymous_write_is_401_not_a_csrf_403(project):
    browser = Client(enforce_csrf_checks=True)
    response = browser.post(PUBLISH, json.dumps({"spec": CHANGED, "message": "x"}), content_type="application/json")
    assert_401(response, "Authorization: Bearer")


def test_token_writes_need_no_csrf(owner, registry, token_for):
    script = Client(enforce_csrf_checks=True)
    response = script.post(PUBLISH, json.dumps({"spec": CHANGED, "message": "from a script"}),
                           content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {token_for(owner)}")
    assert response.status_code == 201
    assert response.json()["version"]["author"] == "olive"


def test_token_use_is_recorded_at_most_once_a_minute(api_as, owner, project):
    from datetime import timedelta

    from apps.accounts.models import ApiToken

    api = api_as(owner)
    assert api.get("/projects").status_code == 200
    token = ApiToken.objects.get(user=owner)
    first = token.last_used_at
    assert first is not None
    assert api.get("/projects").status_code == 200
    assert ApiToken.objects.get(pk=token.pk).last_used_at == first
    ApiToken.objects.filter(pk=token.pk).update(last_used_at=first - timedelta(minutes=2))
    assert api.get("/projects").status_code == 200
    assert ApiToken.objects.get(pk=token.pk).last_used_at > first


def test_an_expired_token_is_401(api_as, owner, project):
    from datetime import timedelta

    from django.utils import timezone

    api = api_as(owner, expires_at=timezone.now() + timedelta(hours=1))
    assert api.get("/projects").status_code == 200
    ApiToken.objects.filter(user=owner).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert_401(api.get("/projects"), "expired")


def test_a_token_acts_in_its_one_project_and_within_its_scope(api_as, owner, project, registry):
    from apps.accounts.services import project_create

    project_create(team_slug="acme", slug="acme-two", name="Acme two", owner=owner)
    reader = api_as(owner, project=project, scope="read")
    assert [(p["slug"], p["role"]) for p in reader.get("/projects").json()] == [("acme-rl", "viewer")]
    assert reader.get("/projects/acme-two/definitions").status_code == 404  # the owner's, not the token's
    refused = reader.post("/projects/acme-rl/definitions/verifier/numeric/versions", {"spec": CHANGED, "message": "m"})
    assert refused.status_code == 403 and "scope is read" in refused.json()["detail"]
    assert Version.objects.filter(definition__slug="numeric").count() == 1

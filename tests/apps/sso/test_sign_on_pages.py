"""The login page with passwords switched off (only the break-glass account; API tokens still work), the session
re-check that signs out a person whose groups no longer map, and the members page and API where owners map
groups to roles."""

import pytest
from django.test import Client

from apps.accounts.models import Membership, Role
from apps.sso.middleware import SIGNED_ON_VIA
from apps.sso.models import GroupRoleMapping
from apps.sso.services import mapping_set, sso_login_admit

from .conftest import PROVIDER


def login(client, username):
    return client.post("/accounts/login/", {"username": username, "password": "pw-for-tests"})


def test_passwords_off_but_for_the_break_glass_account(sign_on, settings, make_user, client):
    settings.LOCAL_LOGIN = False
    settings.BREAK_GLASS_USER = "root-breakglass"
    make_user("alice"), make_user("root-breakglass")
    page = client.get("/accounts/login/").content.decode()
    assert "Log in with Test IdP" in page and 'name="password"' not in page
    assert login(client, "alice").status_code == 200  # the form again: refused
    assert "_auth_user_id" not in client.session
    assert 'name="password"' in client.get("/accounts/login/?break-glass").content.decode()
    assert login(client, "root-breakglass").status_code == 302
    assert client.session["_auth_user_id"]


def test_passwords_on_by_default(sign_on, make_user, client):
    make_user("alice")
    page = client.get("/accounts/login/").content.decode()
    assert "Log in with Test IdP" in page and 'name="password"' in page
    assert login(client, "alice").status_code == 302


def test_api_tokens_work_with_passwords_off(settings, project, owner, api_as):
    settings.LOCAL_LOGIN = False
    assert api_as(owner).get("/projects").status_code == 200


def test_a_signed_on_person_without_roles_is_signed_out_at_the_next_request(sign_on, project, owner):
    mapping = mapping_set(project=project, provider=PROVIDER, group="ml-team", role=Role.VIEWER, actor=owner)
    user = sso_login_admit(provider=PROVIDER, claims={"sub": "s-1", "preferred_username": "ada",
                                                      "groups": ["ml-team"]})
    browser = Client()
    browser.force_login(user)
    session = browser.session
    session[SIGNED_ON_VIA] = PROVIDER
    session.save()
    assert browser.get(f"/p/{project.slug}/members/").status_code == 200
    Membership.objects.filter(user=user).delete()  # as a login with other groups, or SCIM, would
    mapping.delete()
    answer = browser.get(f"/p/{project.slug}/members/")
    assert answer.status_code == 403 and "no longer holds a role" in answer.content.decode()
    assert browser.get(f"/p/{project.slug}/members/").status_code == 302  # to the login page: signed out


def test_owners_map_groups_on_the_members_page(sign_on, project, owner, member):
    browser = Client()
    browser.force_login(owner)
    url = f"/p/{project.slug}/members/"
    assert browser.post(url, {"provider": PROVIDER, "group": "/acme/ml team", "role": "editor"}).status_code == 302
    mapping = GroupRoleMapping.objects.get(project=project)
    assert (mapping.group, mapping.role) == ("/acme/ml team", "editor")
    page = browser.get(url).content.decode()
    assert "/acme/ml team" in page and "olive" in page
    assert browser.post(url, {"provider": "nope", "group": "g", "role": "editor"}).status_code == 400
    viewer = Client()
    viewer.force_login(member("viewer"))
    assert "/acme/ml team" not in viewer.get(url).content.decode()  # members see who holds which role, not mappings
    assert viewer.post(url, {"delete": mapping.pk}).status_code == 403
    assert browser.post(url, {"delete": mapping.pk}).status_code == 302
    assert not GroupRoleMapping.objects.exists()


@pytest.mark.parametrize("role, status", [("editor", 403), ("owner", 200)])
def test_the_mappings_api_is_for_owners(sign_on, project, owner, member, api_as, role, status):
    caller = owner if role == "owner" else member(role)
    api = api_as(caller, scope="admin" if role == "owner" else "write")
    answer = api.post(f"/projects/{project.slug}/sso-mappings", {"provider": PROVIDER, "group": "ml", "role": "viewer"})
    assert answer.status_code == status, answer.content
    if status == 200:
        mapping = answer.json()
        assert api.get(f"/projects/{project.slug}/sso-mappings").json()[0]["group"] == "ml"
        again = api.post(f"/projects/{project.slug}/sso-mappings", {"provider": PROVIDER, "group": "ml",
                                                                    "role": "editor"}).json()
        assert again["id"] == mapping["id"] and again["role"] == "editor"
        assert api.client.delete(f"/api/v1/projects/{project.slug}/sso-mappings/{mapping['id']}",
                                 **api.headers).status_code == 204
        assert api.client.delete(f"/api/v1/projects/{project.slug}/sso-mappings/{mapping['id']}",
                                 **api.headers).status_code == 404

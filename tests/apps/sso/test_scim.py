"""SCIM 2.0 provisioning at /scim/v2 (apps/sso/scim.py): the identity provider's calls as Okta and Entra ID make
them, against the real views and database. Deactivating someone ends a live, signed-in Django test client's
session and their API token at once."""


import pytest
from django.contrib.sessions.models import Session
from django.test import Client

from apps.accounts.models import ApiToken, AuditEvent, Membership, Role, TokenScope
from apps.accounts.services import scim_token_create
from apps.sso.models import GroupRoleMapping
from apps.sso.scim_models import ScimGroup

from .conftest import ERROR, GROUP_SCHEMA, PATCH_OP, PROVIDER, USER_SCHEMA, ScimClient, new_user


def test_create_then_find_by_username_and_get(scim):
    created = new_user(scim)
    assert created["userName"] == "alice@example.com" and created["active"] is True
    assert created["externalId"] == "00u1" and created["meta"]["location"].endswith(f"/scim/v2/Users/{created['id']}")
    from django.contrib.auth import get_user_model
    user = get_user_model().objects.get(pk=int(created["id"]))
    assert not user.has_usable_password()  # a SCIM password is never kept: they sign in at the provider

    found = scim.call("get", '/Users?filter=userName eq "alice@example.com"').json()
    assert found["totalResults"] == 1 and found["Resources"][0]["id"] == created["id"]
    assert scim.call("get", '/Users?filter=userName eq "bob@example.com"').json()["totalResults"] == 0
    assert scim.call("get", f"/Users/{created['id']}").json()["name"]["familyName"] == "Liddell"
    assert AuditEvent.objects.filter(action="user.provision", via="scim", target="user/alice@example.com").exists()


def test_errors_are_scim_errors(scim):
    new_user(scim)
    conflict = scim.call("post", "/Users", {"schemas": [USER_SCHEMA], "userName": "alice@example.com"})
    assert conflict.status_code == 409 and conflict.json()["scimType"] == "uniqueness"
    assert ERROR in conflict.json()["schemas"]
    for missing in ("/Users/999999", "/Users/not-a-number", "/Groups/not-a-uuid",
                    "/Groups/6a0c1d2e-0000-4000-8000-000000000000"):
        response = scim.call("get", missing)
        assert response.status_code == 404 and ERROR in response.json()["schemas"], missing
    bad = scim.call("post", "/Users", {"schemas": [USER_SCHEMA], "name": {"givenName": "No"}})
    assert bad.status_code == 400 and "userName" in bad.json()["detail"]
    assert scim.call("get", "/Users?filter=userName zz").status_code == 400


def test_discovery_endpoints(scim):
    config = scim.call("get", "/ServiceProviderConfig").json()
    assert config["patch"]["supported"] and config["filter"]["supported"]
    assert config["authenticationSchemes"][0]["type"] == "oauthbearertoken"
    assert {r["id"] for r in scim.call("get", "/ResourceTypes").json()["Resources"]} == {"User", "Group"}
    assert USER_SCHEMA in {s["id"] for s in scim.call("get", "/Schemas").json()["Resources"]}


def test_superusers_are_not_scim_resources(scim, make_user):
    admin = make_user("root")
    admin.is_superuser = True
    admin.save()
    assert scim.call("get", '/Users?filter=userName eq "root"').json()["totalResults"] == 0
    assert scim.call("get", f"/Users/{admin.pk}").status_code == 404
    assert scim.call("patch", f"/Users/{admin.pk}", {"schemas": [PATCH_OP], "Operations": [
        {"op": "replace", "value": {"active": False}}]}).status_code == 404
    admin.refresh_from_db()
    assert admin.is_active


@pytest.mark.parametrize("operations", [
    [{"op": "replace", "value": {"active": False}}],  # Okta
    [{"op": "Replace", "path": "active", "value": "False"}],  # Entra ID
], ids=["okta", "entra-id"])
def test_patch_active_false_ends_a_live_session_and_the_token(scim, operations, project, owner, token_for):
    created = new_user(scim)
    from django.contrib.auth import get_user_model
    alice = get_user_model().objects.get(pk=int(created["id"]))
    Membership.objects.create(project=project, user=alice, role=Role.EDITOR)
    browser = Client()
    browser.force_login(alice)
    assert browser.get(f"/p/{project.slug}/registry/").status_code == 200
    api = Client(HTTP_AUTHORIZATION=f"Bearer {token_for(alice, project)}")
    assert api.get("/api/v1/projects").status_code == 200
    other = Client()
    other.force_login(owner)  # someone else's session is left alone

    response = scim.call("patch", f"/Users/{created['id']}", {"schemas": [PATCH_OP], "Operations": operations})
    assert response.status_code == 200 and response.json()["active"] is False

    assert not Session.objects.filter(session_key=browser.session.session_key).exists()
    page = browser.get(f"/p/{project.slug}/registry/")
    assert page.status_code == 302 and page["Location"].startswith("/accounts/login/")
    assert api.get("/api/v1/projects").status_code == 401
    assert not ApiToken.objects.filter(user=alice, revoked_at__isnull=True).exists()
    assert other.get(f"/p/{project.slug}/registry/").status_code == 200
    event = AuditEvent.objects.get(action="user.deactivate", target="user/alice@example.com")
    assert event.via == "scim" and event.details["sessions_ended"] == 1 and len(event.details["tokens_revoked"]) == 1


def test_delete_deactivates_and_answers_404_after(scim):
    created = new_user(scim)
    assert scim.call("delete", f"/Users/{created['id']}").status_code == 204
    assert scim.call("get", f"/Users/{created['id']}").status_code == 404
    assert scim.call("get", '/Users?filter=userName eq "alice@example.com"').json()["totalResults"] == 0
    from django.contrib.auth import get_user_model
    assert not get_user_model().objects.get(pk=int(created["id"])).is_active  # kept, for what they authored


def test_put_and_patch_update_attributes(scim):
    created = new_user(scim)
    put = scim.call("put", f"/Users/{created['id']}", {
        "schemas": [USER_SCHEMA], "userName": "alice@example.com", "name": {"givenName": "Alicia",
                                                                              "familyName": "Liddell"}})
    assert put.status_code == 200 and put.json()["name"]["givenName"] == "Alicia" and put.json()["active"]
    patched = scim.call("patch", f"/Users/{created['id']}", {"schemas": [PATCH_OP], "Operations": [
        {"op": "replace", "path": "name.familyName", "value": "Hargreaves"},
        {"op": "replace", "path": 'emails[type eq "work"].value', "value": "alice.h@example.com"},
        {"op": "add", "path": "urn:ietf:params:scim:schemas:extension:enterprise:2.0:User:department",
         "value": "Research"}]})
    assert patched.status_code == 200, patched.content
    assert patched.json()["name"]["familyName"] == "Hargreaves"
    assert patched.json()["emails"][0]["value"] == "alice.h@example.com"
    bad = scim.call("patch", f"/Users/{created['id']}", {"schemas": [PATCH_OP], "Operations": [
        {"op": "replace", "path": "active", "value": "maybe"}]})
    assert bad.status_code == 400 and "active" in bad.json()["detail"]


def test_group_members_give_the_mapped_roles(scim, project):
    GroupRoleMapping.objects.create(project=project, provider=PROVIDER, group="ml-team", role=Role.EDITOR)
    alice, bob = new_user(scim), new_user(scim, "bob@example.com")
    group = scim.call("post", "/Groups", {"schemas": [GROUP_SCHEMA], "displayName": "ml-team",
                                          "members": [{"value": alice["id"]}]})
    assert group.status_code == 201, group.content
    group_id = group.json()["id"]
    assert Membership.objects.get(project=project, user_id=int(alice["id"])).role == Role.EDITOR
    assert scim.call("get", '/Groups?filter=displayName eq "ml-team"').json()["totalResults"] == 1
    assert scim.call("get", f"/Users/{alice['id']}").json()["groups"][0]["display"] == "ml-team"

    added = scim.call("patch", f"/Groups/{group_id}", {"schemas": [PATCH_OP], "Operations": [
        {"op": "add", "path": "members", "value": [{"value": bob["id"]}]}]})
    assert added.status_code == 200 and len(added.json()["members"]) == 2
    assert Membership.objects.get(project=project, user_id=int(bob["id"])).granted_by == PROVIDER

    removed = scim.call("patch", f"/Groups/{group_id}", {"schemas": [PATCH_OP], "Operations": [
        {"op": "remove", "path": f'members[value eq "{alice["id"]}"]'}]})
    assert [m["value"] for m in removed.json()["members"]] == [bob["id"]]
    assert not Membership.objects.filter(project=project, user_id=int(alice["id"])).exists()
    remove_event = AuditEvent.objects.get(action="membership.sso_remove", target="user/alice@example.com")
    assert remove_event.details["provider"] == PROVIDER
    assert remove_event.details["claim"] == "scim:groups"

    unknown = scim.call("patch", f"/Groups/{group_id}", {"schemas": [PATCH_OP], "Operations": [
        {"op": "add", "path": "members", "value": [{"value": "987654"}]}]})
    assert unknown.status_code == 400 and "987654" in unknown.json()["detail"]

    assert scim.call("delete", f"/Groups/{group_id}").status_code == 204
    assert not ScimGroup.objects.exists()
    assert not Membership.objects.filter(project=project, user_id=int(bob["id"])).exists()


def test_a_hand_granted_role_is_left_alone(scim, project):
    alice = new_user(scim)
    Membership.objects.create(project=project, user_id=int(alice["id"]), role=Role.VIEWER)
    group = scim.call("post", "/Groups", {"schemas": [GROUP_SCHEMA], "displayName": "unmapped",
                                          "members": [{"value": alice["id"]}]}).json()
    scim.call("patch", f"/Groups/{group['id']}", {"schemas": [PATCH_OP], "Operations": [
        {"op": "replace", "path": "members", "value": []}]})
    assert Membership.objects.get(project=project, user_id=int(alice["id"])).role == Role.VIEWER


def test_only_a_scim_token_is_accepted(scim_token, operator, owner, project, token_for):
    users = "/Users"
    assert ScimClient(None).call("get", users).status_code == 401
    project_token = ScimClient(token_for(owner, project, scope=TokenScope.ADMIN)).call("get", users)
    assert project_token.status_code == 401 and "scim scope" in project_token.json()["detail"]
    assert project_token["WWW-Authenticate"].startswith("Bearer")
    signed_in = ScimClient(None)
    signed_in.client.force_login(operator)
    assert signed_in.call("get", users).status_code == 401  # a browser session is not a SCIM client
    assert ScimClient(scim_token).call("get", users).status_code == 200

    token = ApiToken.objects.get(scope=TokenScope.SCIM)
    token.revoked_at = token.created_at
    token.save()
    assert ScimClient(scim_token).call("get", users).status_code == 401


def test_the_rest_api_refuses_a_scim_token(scim_token, project):
    response = Client().get("/api/v1/projects", HTTP_AUTHORIZATION=f"Bearer {scim_token}")
    assert response.status_code == 401 and "SCIM token" in response.json()["detail"]


def test_only_staff_hold_a_scim_token_of_a_configured_provider(sign_on, operator, owner, project):
    with pytest.raises(ValueError, match="staff"):
        scim_token_create(user=owner, provider=PROVIDER, name="okta")
    with pytest.raises(ValueError, match="No identity provider 'scim'.*configured: test-idp"):
        scim_token_create(user=operator, provider="scim", name="okta")
    from apps.accounts.services import api_token_create
    with pytest.raises(ValueError, match="scim_token"):
        api_token_create(user=owner, name="x", project=project, scope=TokenScope.SCIM)


def test_the_command_makes_lists_and_revokes_audited(sign_on, operator, capsys):
    from django.core.management import call_command
    call_command("scim_token", "create", "--provider", PROVIDER, "--user", operator.username, "--name", "okta")
    plaintext = capsys.readouterr().out.strip()
    assert plaintext.startswith("pts_")
    assert ScimClient(plaintext).call("get", "/Users").status_code == 200
    event = AuditEvent.objects.get(action="token.create")
    assert event.via == "cli" and event.details["scope"] == "scim" and event.actor == operator
    assert event.details["provider"] == PROVIDER
    call_command("scim_token", "list")
    assert f"okta  for {PROVIDER}" in capsys.readouterr().out
    call_command("scim_token", "revoke", plaintext)
    assert ScimClient(plaintext).call("get", "/Users").status_code == 401
    assert AuditEvent.objects.filter(action="token.revoke", via="cli").exists()

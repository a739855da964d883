"""The order enterprises use: the identity provider provisions a person over SCIM first, and the person logs in
later. The login is linked to the account SCIM made (never a second one), so what SCIM does to them afterwards
(deactivation) reaches the account they use. Logins walk the whole OpenID Connect code flow through the studio's
real views, against the loopback issuer's real token endpoint and JWKS; SCIM calls go through the real /scim/v2."""

import base64
import hashlib
from urllib.parse import parse_qs, urlsplit

import pytest
from allauth.socialaccount.models import SocialAccount
from django.contrib.auth import get_user_model
from django.test import Client

from apps.accounts.models import ApiToken, AuditEvent, Membership, Role, TokenScope
from apps.accounts.services import api_token_create, scim_token_create
from apps.sso.models import GroupRoleMapping
from apps.sso.services import SsoRefused, sso_login_admit

from .conftest import GROUP_SCHEMA, PATCH_OP, PROVIDER, ScimClient, new_user

User = get_user_model()
OTHER = "other-idp"


@pytest.fixture
def two_providers(sign_on, settings):
    """test-idp and a second OpenID Provider, other-idp (the same loopback issuer: another provider id is another
    identity provider to the studio)."""
    [app] = settings.SOCIALACCOUNT_PROVIDERS["openid_connect"]["APPS"]
    settings.SOCIALACCOUNT_PROVIDERS = {"openid_connect": {
        **settings.SOCIALACCOUNT_PROVIDERS["openid_connect"],
        "APPS": [app, {**app, "provider_id": OTHER, "name": "Other IdP"}]}}
    settings.SIGN_ON_PROVIDERS = {**settings.SIGN_ON_PROVIDERS,
                                  OTHER: {"name": "Other IdP", "protocol": "oidc", "groups_claim": "groups"}}
    return sign_on


def oidc_login(browser: Client, issuer, *, provider: str = PROVIDER, **claims):
    """Log in as the login page's button does: the studio's redirect to the provider, the provider's answer (a code
    for an ID token of `claims` with this login's nonce), the callback. Returns the callback's response and what the
    studio sent to the provider (its query, and the token request's form)."""
    start = browser.post(f"/accounts/sso/oidc/{provider}/login/")
    assert start.status_code == 302 and start["Location"].startswith(f"{issuer.url}/auth?"), start
    query = {k: v[0] for k, v in parse_qs(urlsplit(start["Location"]).query).items()}
    code = issuer.grant(issuer.claims(nonce=query["nonce"], **claims))
    answer = browser.get(f"/accounts/sso/oidc/{provider}/login/callback/", {"code": code, "state": query["state"]})
    return answer, query, issuer.redeemed.get(code, {})


def signed_in_as(browser: Client):
    user_id = browser.session.get("_auth_user_id")
    return User.objects.get(pk=user_id) if user_id else None


ALICE = {"sub": "okta-sub-alice", "email": "alice@example.com", "email_verified": True, "groups": []}


@pytest.fixture
def ml_team(scim, project):
    """The provider's group ml-team, pushed over SCIM, mapped to editor under test-idp (the same mapping a login's
    groups claim would meet)."""
    GroupRoleMapping.objects.create(project=project, provider=PROVIDER, group="ml-team", role=Role.EDITOR)
    created = scim.call("post", "/Groups", {"schemas": [GROUP_SCHEMA], "displayName": "ml-team", "members": []})
    assert created.status_code == 201, created.content
    return created.json()["id"]


def join(scim, group_id, user_id):
    answer = scim.call("patch", f"/Groups/{group_id}", {"schemas": [PATCH_OP], "Operations": [
        {"op": "add", "path": "members", "value": [{"value": user_id}]}]})
    assert answer.status_code == 200, answer.content


def test_scim_first_then_login_is_one_account_and_deactivation_reaches_it(scim, ml_team, project, sign_on):
    provisioned = new_user(scim)  # userName alice@example.com, externalId 00u1
    join(scim, ml_team, provisioned["id"])
    alice = User.objects.get(pk=int(provisioned["id"]))
    assert Membership.objects.get(project=project, user=alice).role == Role.EDITOR  # from the SCIM group

    browser = Client()
    answer, query, token_request = oidc_login(browser, sign_on, **ALICE)  # no groups claim: SCIM's groups count
    assert answer.status_code == 302, answer.content[:2000]
    assert signed_in_as(browser) == alice  # the SCIM-made account, not a second one
    assert User.objects.filter(email="alice@example.com").count() == 1
    assert SocialAccount.objects.get(provider=PROVIDER, uid=ALICE["sub"]).user == alice
    link = AuditEvent.objects.get(action="user.sso_link")
    assert link.details == {"provider": PROVIDER, "subject": ALICE["sub"], "matched": "userName", "claim": "email"}
    # The code flow used PKCE (S256): the verifier the studio sent hashes to the challenge it sent first.
    digest = hashlib.sha256(token_request["code_verifier"].encode()).digest()
    assert query["code_challenge_method"] == "S256"
    assert base64.urlsafe_b64encode(digest).rstrip(b"=").decode() == query["code_challenge"]
    assert Membership.objects.get(project=project, user=alice).role == Role.EDITOR
    assert browser.get(f"/p/{project.slug}/members/").status_code == 200

    _, api_token = api_token_create(user=alice, name="laptop", project=project, scope=TokenScope.READ)
    api = Client(HTTP_AUTHORIZATION=f"Bearer {api_token}")
    assert api.get("/api/v1/projects").status_code == 200

    deactivated = scim.call("patch", f"/Users/{provisioned['id']}", {"schemas": [PATCH_OP], "Operations": [
        {"op": "replace", "value": {"active": False}}]})
    assert deactivated.status_code == 200 and deactivated.json()["active"] is False
    page = browser.get(f"/p/{project.slug}/members/")
    assert page.status_code == 302 and page["Location"].startswith("/accounts/login/")  # the session ended
    assert api.get("/api/v1/projects").status_code == 401
    assert not ApiToken.objects.filter(user=alice, revoked_at__isnull=True).exists()
    assert AuditEvent.objects.get(action="user.deactivate", target="user/alice@example.com").details[
        "sessions_ended"] == 1

    # Their groups still map (ml-team in the claim too), but the account is deactivated: refused, with the page.
    again, _, _ = oidc_login(Client(), sign_on, **{**ALICE, "groups": ["ml-team"]})
    assert again.status_code == 403 and b"deactivated" in again.content
    assert b"data-sso-refused" in again.content
    assert User.objects.filter(email="alice@example.com").count() == 1  # and no new account for them


def test_a_person_deactivated_before_their_first_login_gets_no_account(scim, ml_team, sign_on):
    provisioned = new_user(scim, active=False)
    join(scim, ml_team, provisioned["id"])
    answer, _, _ = oidc_login(Client(), sign_on, **{**ALICE, "groups": ["ml-team"]})
    assert answer.status_code == 403 and b"deactivated" in answer.content
    assert User.objects.filter(email="alice@example.com").count() == 1
    assert not SocialAccount.objects.exists()


def test_okta_sends_its_user_id_as_externalid_and_sub(scim, ml_team, project, sign_on):
    """Okta: the SCIM externalId is the Okta user id (00u...), its ID token's sub the same id; no email needed."""
    provisioned = new_user(scim, "alice", externalId="00uALICE", emails=[{"value": "alice@corp.example"}])
    join(scim, ml_team, provisioned["id"])
    browser = Client()
    answer, _, _ = oidc_login(browser, sign_on, sub="00uALICE", email="someone@else.example", groups=[])
    assert answer.status_code == 302 and signed_in_as(browser).pk == int(provisioned["id"])
    assert AuditEvent.objects.get(action="user.sso_link").details["matched"] == "externalId"


def test_the_match_claim_is_a_setting_and_an_unverified_email_never_matches(scim, ml_team, sign_on, settings):
    provisioned = new_user(scim)
    join(scim, ml_team, provisioned["id"])
    # An address the person could have typed at the provider does not pick an account: no link, and no role.
    answer, _, _ = oidc_login(Client(), sign_on, **{**ALICE, "email_verified": False})
    assert answer.status_code == 403 and not SocialAccount.objects.exists()
    # Entra ID: the SCIM userName is the userPrincipalName, which its ID token carries as preferred_username.
    settings.SIGN_ON_PROVIDERS = {PROVIDER: {**settings.SIGN_ON_PROVIDERS[PROVIDER],
                                             "scim_match": "preferred_username"}}
    browser = Client()
    answer, _, _ = oidc_login(browser, sign_on, sub="pairwise-sub", preferred_username="Alice@Example.com",
                              groups=[])
    assert answer.status_code == 302 and signed_in_as(browser).pk == int(provisioned["id"])  # case-insensitive


def test_no_link_to_a_local_account_or_another_providers_person(two_providers, scim, project, owner, make_user):
    local = make_user("bob@example.com")
    alice = User.objects.get(pk=int(new_user(scim)["id"]))  # provisioned by test-idp
    for provider in (PROVIDER, OTHER):
        GroupRoleMapping.objects.create(project=project, provider=provider, group="staff", role=Role.VIEWER)

    # other-idp vouches for alice@example.com: not test-idp's person, so a new account of its own.
    browser = Client()
    answer, _, _ = oidc_login(browser, two_providers, provider=OTHER, **{**ALICE, "groups": ["staff"]})
    assert answer.status_code == 302
    theirs = signed_in_as(browser)
    assert theirs != alice and theirs.username == f"alice@example.com-{OTHER}"
    assert not SocialAccount.objects.filter(user=alice).exists()
    # test-idp vouches for bob@example.com, a local account: not taken over.
    browser = Client()
    answer, _, _ = oidc_login(browser, two_providers, sub="okta-sub-bob", email="bob@example.com",
                              email_verified=True, groups=["staff"])
    assert answer.status_code == 302 and signed_in_as(browser) not in (local, None)
    assert not SocialAccount.objects.filter(user=local).exists()

    # And test-idp's SCIM token sees neither the local account nor other-idp's person; its POST of the local name
    # is refused rather than handed the account.
    assert scim.call("get", '/Users?filter=userName eq "bob@example.com"').json()["totalResults"] == 0
    assert scim.call("get", f"/Users/{local.pk}").status_code == 404
    assert scim.call("get", f"/Users/{theirs.pk}").status_code == 404
    listed = {r["userName"] for r in scim.call("get", "/Users").json()["Resources"]}
    assert "bob@example.com" not in listed and theirs.username not in listed and "alice@example.com" in listed
    conflict = scim.call("post", "/Users", {"schemas": ["urn:ietf:params:scim:schemas:core:2.0:User"],
                                            "userName": "bob@example.com"})
    assert conflict.status_code == 409 and "does not manage" in conflict.json()["detail"]
    # other-idp's own SCIM token sees its person, not test-idp's.
    other = ScimClient(scim_token_create(user=User.objects.get(username="it-operator"), provider=OTHER,
                                         name="other")[1])
    names = {r["userName"] for r in other.call("get", "/Users").json()["Resources"]}
    assert names == {theirs.username}


def test_for_a_pushed_group_scim_decides_and_a_removal_is_at_once(scim, ml_team, project, sign_on):
    provisioned = new_user(scim)
    alice = User.objects.get(pk=int(provisioned["id"]))
    # The login's claim says ml-team, but ml-team is pushed over SCIM and alice is not in it there: no role.
    with pytest.raises(SsoRefused, match="No project here gives"):
        sso_login_admit(provider=PROVIDER, claims={**ALICE, "groups": ["ml-team"]})
    join(scim, ml_team, provisioned["id"])
    assert sso_login_admit(provider=PROVIDER, claims={**ALICE, "groups": ["ml-team"]}) == alice
    grant = AuditEvent.objects.filter(action="membership.sso_grant", target="user/alice@example.com").first()
    assert grant.details["claim"] == "scim:groups"
    # SCIM takes her out of ml-team: the role goes now, although her last login's claim still said ml-team.
    removed = scim.call("patch", f"/Groups/{ml_team}", {"schemas": [PATCH_OP], "Operations": [
        {"op": "remove", "path": f'members[value eq "{provisioned["id"]}"]'}]})
    assert removed.status_code == 200
    assert not Membership.objects.filter(project=project, user=alice).exists()
    # A group SCIM does not push still counts from the login's claim, at a SCIM change too.
    GroupRoleMapping.objects.create(project=project, provider=PROVIDER, group="readers", role=Role.VIEWER)
    sso_login_admit(provider=PROVIDER, claims={**ALICE, "groups": ["readers", "ml-team"]})
    assert Membership.objects.get(project=project, user=alice).role == Role.VIEWER
    join(scim, ml_team, provisioned["id"])
    assert Membership.objects.get(project=project, user=alice).role == Role.EDITOR

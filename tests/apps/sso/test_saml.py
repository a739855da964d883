"""SAML 2.0 logins (allauth's provider completed by apps/sso/saml.py) refuse the attacks a security review tries:
an unsigned assertion, one signed by another key, one for another service (audience) or sent to another place
(recipient), an expired one, and a replayed one. Each response is real XML signed with the test's own IdP key by
python3-saml and xmlsec, posted to the real ACS view after a real login request; a well-formed one logs in, so
each refusal is the check's doing."""

import copy
from datetime import UTC, datetime, timedelta

import pytest
from django.test import Client

from apps.accounts.models import AuditEvent, Membership, Role
from apps.accounts.services import scim_token_create
from apps.sso.models import GroupRoleMapping, SamlAssertion
from tests.support.saml import assertion_xml, request_id, response_b64, sign, signing_key

from .conftest import PATCH_OP, ScimClient, new_user

PROVIDER = "corp-saml"
IDP = "https://idp.example.test/saml"
SSO_URL = "https://idp.example.test/saml/sso"
BASE = f"http://testserver/accounts/sso/saml/{PROVIDER}"
ACS = f"{BASE}/acs/"
SP_ENTITY = f"{BASE}/metadata/"

KEY = signing_key("corp-idp")
OTHER_KEY = signing_key("someone-else")


@pytest.fixture(autouse=True)
def saml_provider(settings):
    app = {"provider_id": PROVIDER, "name": "Corp SAML", "client_id": PROVIDER, "settings": {
        "idp": {"entity_id": IDP, "sso_url": SSO_URL, "x509cert": KEY.cert_body},
        "attribute_mapping": {"uid": [], "email": ["email"], "first_name": ["givenName"], "last_name": ["sn"],
                              "username": ["username"]},
        "groups_claim": "memberOf",
        "advanced": {"strict": True, "want_assertion_signed": True, "reject_idp_initiated_sso": True,
                     "allow_single_label_domains": True, "reject_deprecated_algorithm": True}}}
    providers = copy.deepcopy(settings.SOCIALACCOUNT_PROVIDERS)
    providers["saml"]["APPS"] = [app]
    settings.SOCIALACCOUNT_PROVIDERS = providers
    settings.SIGN_ON_PROVIDERS = {**settings.SIGN_ON_PROVIDERS,
                                  PROVIDER: {"name": "Corp SAML", "protocol": "saml", "groups_claim": "memberOf"}}


@pytest.fixture
def client():
    return browser()


def browser() -> Client:
    return Client(HTTP_HOST="testserver")  # a browser sends Host, which allauth's SAML views read


@pytest.fixture
def mapped(project):
    GroupRoleMapping.objects.create(project=project, provider=PROVIDER, group="ml-team", role=Role.EDITOR)
    return project


def login_request(client: Client) -> str:
    """Start a login as the login page's button does; the AuthnRequest's ID the IdP would answer."""
    response = client.post(f"/accounts/sso/saml/{PROVIDER}/login/")
    assert response.status_code == 302 and response["Location"].startswith(SSO_URL), response
    return request_id(response["Location"])


def good_assertion(in_response_to, **changes) -> str:
    fields = {"issuer": IDP, "name_id": "alice-0001", "audience": SP_ENTITY, "recipient": ACS,
              "in_response_to": in_response_to,
              "attributes": {"email": ["alice@example.com"], "username": ["alice"], "memberOf": ["ml-team"]}}
    return assertion_xml(**{**fields, **changes})


def post_response(client: Client, in_response_to, assertion: str):
    """POST the response to the ACS as the browser does, and follow to allauth's finish view."""
    acs = client.post(f"/accounts/sso/saml/{PROVIDER}/acs/", {
        "SAMLResponse": response_b64(issuer=IDP, destination=ACS, in_response_to=in_response_to,
                                     assertion=assertion)})
    assert acs.status_code == 302, acs
    return client.get(acs["Location"])


def signed_in(client: Client) -> bool:
    return "_auth_user_id" in client.session


def test_a_signed_assertion_logs_in_with_the_mapped_role(client, mapped):
    rid = login_request(client)
    finish = post_response(client, rid, sign(good_assertion(rid), KEY))
    assert finish.status_code == 302 and signed_in(client), finish.content[:2000]
    membership = Membership.objects.get(project=mapped, user__username="alice")
    assert membership.role == Role.EDITOR and membership.granted_by == PROVIDER
    assert SamlAssertion.objects.filter(provider=PROVIDER).count() == 1


@pytest.mark.parametrize("attack, make", [
    ("unsigned", lambda rid: good_assertion(rid)),
    ("signed by another key", lambda rid: sign(good_assertion(rid), OTHER_KEY)),
    ("wrong audience", lambda rid: sign(good_assertion(rid, audience="https://other-sp.example.test/"), KEY)),
    ("no audience", lambda rid: sign(good_assertion(rid, audience=None), KEY)),
    ("wrong recipient", lambda rid: sign(good_assertion(rid, recipient="https://evil.example.test/acs/"), KEY)),
    ("recipient only containing ours", lambda rid: sign(good_assertion(
        rid, recipient=f"https://evil.example.test/?next={ACS}"), KEY)),
    ("no recipient", lambda rid: sign(good_assertion(rid, recipient=None), KEY)),
    ("expired", lambda rid: sign(good_assertion(rid, issued=datetime.now(UTC) - timedelta(hours=2)), KEY)),
    # python3-saml accepts a bearer confirmation without NotOnOrAfter (SAML's browser profile requires one), and
    # then nothing bounds how long the assertion could be replayed once its ID is forgotten.
    ("confirmation without expiry", lambda rid: sign(good_assertion(
        rid, confirmation_expiry=False, lifetime=timedelta(days=30)), KEY)),
])
def test_attacks_are_refused(client, mapped, attack, make):
    rid = login_request(client)
    finish = post_response(client, rid, make(rid))
    assert not signed_in(client), attack
    assert finish.status_code in (401, 403), (attack, finish.status_code)
    assert not Membership.objects.filter(user__username="alice").exists()


def test_a_replayed_assertion_is_refused(mapped):
    """The IdP's signed assertion names no InResponseTo (SAML allows that), so an attacker who captured it can wrap
    it in a response of their own to a login they started themselves: the signature and allauth's one-time state
    both hold. Only the memory of used assertions refuses it."""
    victim, attacker = browser(), browser()
    rid = login_request(victim)
    captured = sign(good_assertion(None), KEY)
    assert post_response(victim, rid, captured).status_code == 302 and signed_in(victim)

    own_rid = login_request(attacker)
    refused = post_response(attacker, own_rid, captured)
    assert not signed_in(attacker)
    assert refused.status_code == 403 and b"already used" in refused.content


def test_a_person_scim_provisioned_first_logs_in_as_themselves_until_deactivated(client, mapped, operator):
    """The IdP provisions alice over SCIM (with its SCIM token, for this SAML provider), then she logs in: the
    assertion's NameID is her SCIM userName, so the login is her SCIM-made account. Deactivated over SCIM, her next
    login is refused although her groups still map."""
    scim = ScimClient(scim_token_create(user=operator, provider=PROVIDER, name="corp")[1])
    provisioned = new_user(scim, "alice@example.com")
    rid = login_request(client)
    finish = post_response(client, rid, sign(good_assertion(rid, name_id="alice@example.com"), KEY))
    assert finish.status_code == 302 and client.session["_auth_user_id"] == provisioned["id"]
    assert Membership.objects.get(project=mapped, user_id=int(provisioned["id"])).role == Role.EDITOR
    assert AuditEvent.objects.get(action="user.sso_link").details["claim"] == "nameid"

    assert scim.call("patch", f"/Users/{provisioned['id']}", {"schemas": [PATCH_OP], "Operations": [
        {"op": "replace", "path": "active", "value": "False"}]}).status_code == 200  # as Entra ID sends it
    page = client.get(f"/p/{mapped.slug}/members/")  # the session the login made ended
    assert page.status_code == 302 and page["Location"].startswith("/accounts/login/")
    again = browser()
    rid = login_request(again)
    refused = post_response(again, rid, sign(good_assertion(rid, name_id="alice@example.com"), KEY))
    assert refused.status_code == 403 and b"deactivated" in refused.content and not signed_in(again)
    assert not Membership.objects.filter(user__email="alice@example.com").exists()

"""Signing on with SAML 2.0 in a real browser, through a real identity provider on loopback (pysaml2's IdP,
tests/support/saml_idp.py) and its own login page, in the order enterprises use: the identity provider's SCIM client
provisions the person first (POST /Users over HTTP, with the provider's SCIM token), then the person logs in and
lands in the project with the mapped role, as the account SCIM made. Then the SCIM client deactivates them (PATCH
active false): the open browser is signed out at its next request and their API token stops working, at once."""

import copy
import json
import urllib.error
import urllib.request

import pytest
from playwright.sync_api import expect

from apps.accounts.models import AuditEvent, Membership, Role, TokenScope
from apps.accounts.services import api_token_create, scim_token_create
from apps.sso.services import mapping_set
from tests.support.saml import signing_key
from tests.support.saml_idp import Person, SamlIdentityProvider

pytestmark = [pytest.mark.browser, pytest.mark.saml_idp]

PROVIDER = "e2e-saml"


def http(method: str, url: str, token: str, body: dict | None = None) -> tuple[int, dict]:
    request = urllib.request.Request(url, method=method, data=json.dumps(body).encode() if body else None,
                                     headers={"Authorization": f"Bearer {token}",
                                              "Content-Type": "application/scim+json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"{}")


@pytest.fixture
def saml_idp(live_url, tmp_path, settings):
    """The IdP, started for this test, and the studio configured for it (as STUDIO_SAML_* would)."""
    key = signing_key("e2e-idp")
    idp = SamlIdentityProvider(key=key, workdir=tmp_path,
                               people={"ada": Person("ada-password", "ada@example.com", ["ml-team"])})
    app = {"provider_id": PROVIDER, "name": "Corp SAML", "client_id": PROVIDER, "settings": {
        "idp": {"entity_id": idp.entity_id, "sso_url": idp.sso_url, "x509cert": key.cert_body},
        "attribute_mapping": {"uid": [], "email": ["urn:mace:dir:attribute-def:mail"],
                              "username": ["urn:mace:dir:attribute-def:uid"]},
        "groups_claim": "memberOf",
        "advanced": {"strict": True, "want_assertion_signed": True, "reject_idp_initiated_sso": True,
                     "allow_single_label_domains": True}}}
    providers = copy.deepcopy(settings.SOCIALACCOUNT_PROVIDERS)
    providers["saml"]["APPS"] = [app]
    settings.SOCIALACCOUNT_PROVIDERS = providers
    settings.SIGN_ON_PROVIDERS = {PROVIDER: {"name": "Corp SAML", "protocol": "saml", "groups_claim": "memberOf"}}
    with urllib.request.urlopen(f"{live_url}/accounts/sso/saml/{PROVIDER}/metadata/", timeout=30) as response:
        idp.start(sp_metadata=response.read().decode())
    yield idp
    idp.stop()


def test_scim_provisioning_then_saml_login_then_scim_deactivation(saml_idp, live_url, page, project, owner):
    mapping_set(project=project, provider=PROVIDER, group="ml-team", role=Role.EDITOR, actor=owner)
    owner.is_staff = True
    owner.save()
    scim = scim_token_create(user=owner, provider=PROVIDER, name="corp idp")[1]
    # The IdP provisions ada before she ever logs in; its externalId is the id its assertions name her by (NameID).
    status, ada_scim = http("POST", f"{live_url}/scim/v2/Users", scim, {
        "schemas": ["urn:ietf:params:scim:schemas:core:2.0:User"], "userName": "ada", "externalId": "id-ada",
        "emails": [{"value": "ada@example.com", "primary": True}], "active": True})
    assert status == 201, ada_scim
    page.set_default_timeout(15_000)
    members = f"/p/{project.slug}/members/"

    page.goto(live_url + members)
    page.click("text=Log in with Corp SAML")
    page.fill("input[name=username]", "ada")  # the IdP's own login page
    page.fill("input[name=password]", "ada-password")
    page.click("button:has-text('Sign in')")
    page.wait_for_url(f"{live_url}{members}")  # back in the studio, on the page asked for, in the project
    expect(page.locator("[data-member=ada] [data-role]")).to_have_text("editor")
    ada = Membership.objects.get(project=project, user__username="ada", granted_by=PROVIDER).user
    assert ada.pk == int(ada_scim["id"])  # the account SCIM made, not a second one
    assert AuditEvent.objects.get(action="user.sso_link").details["matched"] == "externalId"

    _, api_token = api_token_create(user=ada, name="laptop", project=project, scope=TokenScope.READ)
    assert http("GET", f"{live_url}/api/v1/projects", api_token)[0] == 200

    status, patched = http("PATCH", f"{live_url}/scim/v2/Users/{ada_scim['id']}", scim, {
        "schemas": ["urn:ietf:params:scim:api:messages:2.0:PatchOp"],
        "Operations": [{"op": "replace", "value": {"active": False}}]})
    assert status == 200 and patched["active"] is False

    page.reload()  # the same open browser, its next request
    page.wait_for_url(f"{live_url}/accounts/login/**")
    assert http("GET", f"{live_url}/api/v1/projects", api_token)[0] == 401
    assert AuditEvent.objects.get(action="user.deactivate", target="user/ada").details["sessions_ended"] == 1

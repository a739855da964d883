"""Signing on with SAML 2.0 in a real browser, through a real identity provider on loopback (pysaml2's IdP,
tests/support/saml_idp.py) and its own login page: a person in a mapped group lands in the project with the mapped
role. Then the identity provider's SCIM client deactivates them (PATCH active false with a SCIM token, over HTTP):
the open browser is signed out at its next request and their API token stops working, at once."""

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
    settings.SIGN_ON_PROVIDERS = {PROVIDER: {"name": "Corp SAML", "protocol": "saml", "groups_claim": "memberOf"},
                                  "scim": settings.SIGN_ON_PROVIDERS["scim"]}
    with urllib.request.urlopen(f"{live_url}/accounts/sso/saml/{PROVIDER}/metadata/", timeout=30) as response:
        idp.start(sp_metadata=response.read().decode())
    yield idp
    idp.stop()


def test_saml_login_then_scim_deactivation_ends_the_session_and_token(saml_idp, live_url, page, project, owner):
    mapping_set(project=project, provider=PROVIDER, group="ml-team", role=Role.EDITOR, actor=owner)
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

    _, api_token = api_token_create(user=ada, name="laptop", project=project, scope=TokenScope.READ)
    assert http("GET", f"{live_url}/api/v1/projects", api_token)[0] == 200

    owner.is_staff = True
    owner.save()
    scim = scim_token_create(user=owner, name="corp idp")[1]
    status, found = http("GET", f'{live_url}/scim/v2/Users?filter=userName%20eq%20%22ada%22', scim)
    assert status == 200 and found["totalResults"] == 1
    status, patched = http("PATCH", f"{live_url}/scim/v2/Users/{found['Resources'][0]['id']}", scim, {
        "schemas": ["urn:ietf:params:scim:api:messages:2.0:PatchOp"],
        "Operations": [{"op": "replace", "value": {"active": False}}]})
    assert status == 200 and patched["active"] is False

    page.reload()  # the same open browser, its next request
    page.wait_for_url(f"{live_url}/accounts/login/**")
    assert http("GET", f"{live_url}/api/v1/projects", api_token)[0] == 401
    assert AuditEvent.objects.get(action="user.deactivate", target="user/ada").details["sessions_ended"] == 1

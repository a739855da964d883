"""Signing on with OpenID Connect in a real browser, through a real, certified OpenID Provider (the npm package
oidc-provider, tests/support/idp, on loopback) and its own login page: a person in a mapped group lands in the
project with the mapped role; a person in no mapped group is refused with a page that says why, and gets no
account; a change of a person's groups at the provider changes their role at their next login."""

import json
import socket
import subprocess

import pytest
from playwright.sync_api import expect

from apps.accounts.models import AuditEvent, Membership, Role
from apps.sso.services import mapping_set
from tests.support.resources import IDP_DIR

pytestmark = [pytest.mark.browser, pytest.mark.idp]

PROVIDER = "e2e-idp"
CLIENT_ID, CLIENT_SECRET = "studio-e2e", "tests-only-client-secret"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def idp(live_url, tmp_path, settings):
    """The provider, started for this test, and the studio configured for it (as STUDIO_OIDC_* would): returns
    a function that sets a person's groups in the provider's account store."""
    accounts = tmp_path / "accounts.json"
    people = {"ada": {"email": "ada@example.com", "groups": ["ml-team"]},
              "mallory": {"email": "mallory@example.com", "groups": ["sales"]}}
    accounts.write_text(json.dumps(people))
    port = free_port()
    callback = f"{live_url}/accounts/sso/oidc/{PROVIDER}/login/callback/"
    log = tmp_path / "idp.log"  # its warnings (development keys, in-memory store) and errors
    process = subprocess.Popen(["node", str(IDP_DIR / "oidc_provider.mjs"), str(port), str(accounts), CLIENT_ID,
                                CLIENT_SECRET, callback], stdout=subprocess.PIPE, stderr=log.open("w"), text=True)
    try:
        first = process.stdout.readline()  # "" if it exited
        assert first.strip() == "ready", f"the OpenID Provider did not start: {log.read_text()}"
        issuer = f"http://127.0.0.1:{port}"
        app = {"provider_id": PROVIDER, "name": "Acme SSO", "client_id": CLIENT_ID, "secret": CLIENT_SECRET,
               "settings": {"server_url": issuer, "issuer": issuer, "oauth_pkce_enabled": True,
                            "scope": ["openid", "profile", "email", "groups"], "groups_claim": "groups"}}
        settings.SOCIALACCOUNT_PROVIDERS = {"openid_connect": {**settings.SOCIALACCOUNT_PROVIDERS["openid_connect"],
                                                               "APPS": [app]}}
        settings.SIGN_ON_PROVIDERS = {PROVIDER: {"name": "Acme SSO", "protocol": "oidc", "groups_claim": "groups"}}

        def set_groups(person: str, groups: list[str]):
            people[person]["groups"] = groups
            accounts.write_text(json.dumps(people))

        yield set_groups
    finally:
        process.terminate()
        process.wait(timeout=10)


def log_in_at_the_provider(page, live_url, start: str, person: str):
    page.context.clear_cookies()  # the studio's session and the provider's: a new person at the same browser
    page.goto(live_url + start)
    page.click("text=Log in with Acme SSO")
    page.fill("input[name=login]", person)  # the provider's own login page
    page.fill("input[name=password]", "any password")
    page.click("button:has-text('Sign-in')")
    page.click("button:has-text('Continue')")  # its consent page


def test_sign_on_roles_follow_the_providers_groups(idp, live_url, page, project, owner):
    mapping_set(project=project, provider=PROVIDER, group="ml-team", role=Role.EDITOR, actor=owner)
    mapping_set(project=project, provider=PROVIDER, group="ml-readers", role=Role.VIEWER, actor=owner)
    page.set_default_timeout(15_000)
    page.route("https://**/*", lambda route: route.abort())  # the provider's page asks for a web font: offline
    members = f"/p/{project.slug}/members/"

    log_in_at_the_provider(page, live_url, members, "ada")
    page.wait_for_url(f"{live_url}{members}")  # back in the studio, on the page asked for, in the project
    expect(page.locator("[data-member=ada] [data-role]")).to_have_text("editor")
    assert Membership.objects.get(project=project, user__username="ada").granted_by == PROVIDER

    log_in_at_the_provider(page, live_url, members, "mallory")
    expect(page.locator("[data-sso-refused]")).to_contain_text("these groups: sales. No project here gives")
    assert not Membership.objects.filter(user__username="mallory").exists()
    assert not type(owner).objects.filter(username="mallory").exists()

    idp("ada", ["ml-readers"])  # at the provider: moved to another group
    log_in_at_the_provider(page, live_url, members, "ada")
    page.wait_for_url(f"{live_url}{members}")
    expect(page.locator("[data-member=ada] [data-role]")).to_have_text("viewer")
    change = AuditEvent.objects.get(action="membership.sso_change")
    assert change.details == {"provider": PROVIDER, "claim": "groups", "groups": ["ml-readers"],
                              "from_role": "editor", "to_role": "viewer"}

import json

import pytest
from django.test import Client

from apps.accounts.services import scim_token_create
from tests.support.oidc_issuer import LoopbackIssuer

PROVIDER = "test-idp"


@pytest.fixture
def issuer():
    issuer = LoopbackIssuer()
    yield issuer
    issuer.stop()


@pytest.fixture
def sign_on(settings, issuer, db):
    """The studio configured with one OpenID Provider, `test-idp`, at the loopback issuer (as STUDIO_OIDC_* would)."""
    app = {"provider_id": PROVIDER, "name": "Test IdP", "client_id": issuer.client_id, "secret": "s3cret",
           "settings": {"server_url": issuer.url, "issuer": issuer.url, "scope": ["openid"],
                        "oauth_pkce_enabled": True, "groups_claim": "groups"}}
    settings.SOCIALACCOUNT_PROVIDERS = {"openid_connect": {**settings.SOCIALACCOUNT_PROVIDERS["openid_connect"],
                                                           "APPS": [app]}}
    settings.SIGN_ON_PROVIDERS = {PROVIDER: {"name": "Test IdP", "protocol": "oidc", "groups_claim": "groups"}}
    return issuer


# SCIM: the identity provider's client, as Okta and Entra ID call /scim/v2, with a SCIM token of `test-idp`.
SCIM = "application/scim+json"
USER_SCHEMA = "urn:ietf:params:scim:schemas:core:2.0:User"
GROUP_SCHEMA = "urn:ietf:params:scim:schemas:core:2.0:Group"
PATCH_OP = "urn:ietf:params:scim:api:messages:2.0:PatchOp"
ERROR = "urn:ietf:params:scim:api:messages:2.0:Error"


@pytest.fixture
def operator(make_user):
    user = make_user("it-operator")
    user.is_staff = True
    user.save()
    return user


@pytest.fixture
def scim_token(operator, sign_on):
    return scim_token_create(user=operator, provider=PROVIDER, name="okta")[1]


class ScimClient:
    def __init__(self, token: str | None):
        self.client = Client()
        self.headers = {"HTTP_AUTHORIZATION": f"Bearer {token}"} if token else {}

    def call(self, method: str, path: str, body=None):
        data = json.dumps(body) if body is not None else None
        response = getattr(self.client, method)(f"/scim/v2{path}", data=data, content_type=SCIM, **self.headers)
        if response.content:
            assert response["Content-Type"] == SCIM, response.content
        return response


@pytest.fixture
def scim(scim_token):
    return ScimClient(scim_token)


def new_user(scim, name="alice@example.com", **extra):
    response = scim.call("post", "/Users", {
        "schemas": [USER_SCHEMA], "userName": name, "externalId": "00u1",
        "name": {"givenName": "Alice", "familyName": "Liddell"},
        "emails": [{"value": name, "primary": True, "type": "work"}], "active": True,
        "password": "ignored-by-the-studio", **extra})
    assert response.status_code == 201, response.content
    return response.json()

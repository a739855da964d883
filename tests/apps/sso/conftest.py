import pytest

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

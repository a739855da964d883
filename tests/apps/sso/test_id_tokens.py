"""Every attack on the ID token is refused by the studio's real verification (apps/sso/oidc/tokens.py, through
allauth's jwtkit): tokens signed here with real RSA keys, the keys fetched from a real JWKS endpoint on loopback.
The adapter's own path is exercised too, in the state allauth's code flow leaves it (the token came from the token
endpoint, where allauth would not check the signature at all)."""

import pytest
from django.test import RequestFactory

from apps.sso.oidc.tokens import IdTokenRefused, id_token_claims
from apps.sso.oidc.views import StudioOpenIDConnectAdapter
from tests.support.oidc_issuer import SigningKey

from .conftest import PROVIDER

NONCE = "the-nonce"


def verify(issuer, token, *, nonce=NONCE, client_id=None):
    return id_token_claims(id_token=token, jwks_uri=issuer.jwks_uri, issuer=issuer.url,
                           client_id=client_id or issuer.client_id, nonce=nonce)


def refused(issuer, token, match, **kwargs):
    with pytest.raises(IdTokenRefused, match=match):
        verify(issuer, token, **kwargs)


def test_a_well_signed_token_passes(issuer):
    claims = verify(issuer, issuer.sign(issuer.claims()))
    assert claims["sub"] == "user-1" and claims["groups"] == ["ml-team"]


def test_a_forged_signature_is_refused(issuer):
    forger = SigningKey("key-1")  # the published key's id, someone else's private key
    refused(issuer, issuer.sign(issuer.claims(), key=forger), "Signature verification failed")


def test_a_tampered_payload_is_refused(issuer):
    header, _, signature = issuer.sign(issuer.claims()).split(".")
    other = issuer.sign(issuer.claims(sub="admin")).split(".")[1]
    refused(issuer, f"{header}.{other}.{signature}", "Signature verification failed")


def test_an_expired_token_is_refused(issuer):
    refused(issuer, issuer.sign(issuer.claims(iat=1_600_000_000, exp=1_600_000_300)), "expired")


def test_a_token_without_expiry_is_refused(issuer):
    # PyJWT (and so allauth) checks exp only when the token has one.
    refused(issuer, issuer.sign(issuer.claims(exp=None)), "lacks exp")


def test_another_audience_is_refused(issuer):
    refused(issuer, issuer.sign(issuer.claims(aud="some-other-app")), "(?i)audience")


def test_several_audiences_need_the_studio_as_authorized_party(issuer):
    refused(issuer, issuer.sign(issuer.claims(aud=["studio", "other"], azp="other")), "issued to 'other'")
    assert verify(issuer, issuer.sign(issuer.claims(aud=["studio", "other"], azp="studio")))["sub"] == "user-1"


def test_another_issuer_is_refused(issuer):
    refused(issuer, issuer.sign(issuer.claims(iss="https://evil.example")), "(?i)issuer")


def test_alg_none_is_refused(issuer):
    refused(issuer, issuer.unsigned(issuer.claims(), kid="key-1"), "signed with 'none'")


def test_hmac_with_the_public_key_as_secret_is_refused(issuer):
    token = issuer.hmac_signed(issuer.claims(), issuer.keys[0].public_pem, kid="key-1")
    refused(issuer, token, "signed with 'HS256'")


def test_another_logins_nonce_is_refused(issuer):
    token = issuer.sign(issuer.claims(nonce="an-earlier-login"))
    refused(issuer, token, "nonce is not this login's")
    refused(issuer, issuer.sign(issuer.claims(nonce=None)), "nonce is not this login's")
    refused(issuer, issuer.sign(issuer.claims()), "no nonce", nonce=None)


def test_a_replayed_token_is_refused(issuer):
    token = issuer.sign(issuer.claims(jti="token-42"))
    verify(issuer, token)
    refused(issuer, token, "already used")


def test_a_rotated_key_is_found_and_the_retired_one_refused(issuer):
    old = issuer.keys[0]
    token = issuer.sign(issuer.claims())
    verify(issuer, token)
    new = issuer.rotate("key-2")
    assert verify(issuer, issuer.sign(issuer.claims(), key=new))["sub"] == "user-1"
    refused(issuer, issuer.sign(issuer.claims(), key=old), "kid")


def test_the_adapter_checks_the_signature_of_a_token_from_the_token_endpoint(sign_on, rf: RequestFactory):
    """allauth's adapter skips the signature of an ID token fetched from the token endpoint; ours does not."""
    request = rf.get("/accounts/sso/oidc/test-idp/login/callback/")
    adapter = StudioOpenIDConnectAdapter(request, PROVIDER)
    adapter.did_fetch_access_token = True  # as after allauth's code exchange
    adapter.nonce = NONCE
    app = adapter.get_provider().app
    good = sign_on.sign(sign_on.claims())
    assert adapter._decode_id_token(app, good)["sub"] == "user-1"
    for token in (sign_on.unsigned(sign_on.claims(), kid="key-1"),
                  sign_on.sign(sign_on.claims(), key=SigningKey("key-1")),
                  sign_on.hmac_signed(sign_on.claims(), sign_on.keys[0].public_pem, kid="key-1")):
        with pytest.raises(IdTokenRefused):
            adapter._decode_id_token(app, token)


def test_a_discovery_document_for_another_issuer_is_refused(sign_on, settings, rf):
    from allauth.socialaccount.providers.oauth2.client import OAuth2Error

    app = settings.SOCIALACCOUNT_PROVIDERS["openid_connect"]["APPS"][0]
    app["settings"] = {**app["settings"], "issuer": "https://login.example.com"}
    adapter = StudioOpenIDConnectAdapter(rf.get("/"), PROVIDER)
    with pytest.raises(OAuth2Error, match="names the issuer"):
        _ = adapter.openid_config

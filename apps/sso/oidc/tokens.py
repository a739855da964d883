"""The checks of an OpenID Connect ID token (OpenID Connect Core 1.0, 3.1.3.7), on top of allauth's.

allauth's `jwtkit.verify_and_decode` checks the signature against the provider's JWKS (fetched at every login,
so a rotated key is found as soon as the provider publishes it), the issuer, the audience, the expiry and not-before,
and refuses a `jti` seen before. What it leaves out, and this module adds:
- it takes the algorithm from the token's own header: `alg: none`, or HS256 with the provider's public key as the
  HMAC secret, must be refused before any key is looked at, so only public-key algorithms are accepted;
- a token without `exp`, `iat` or `sub` passes it (PyJWT checks a claim only when it is present);
- it knows no nonce (allauth's OpenID Connect provider sends none), so an ID token from another login could be
  replayed into this one;
- `azp` (the authorized party, when the token has several audiences) is not checked;
- a header without `kid`, or a JWKS key without one, raises KeyError (a server error) instead of a refusal.
allauth also skips the signature check altogether when the token came from the token endpoint (as the spec
allows over TLS); StudioOpenIDConnectAdapter never does.
"""

from __future__ import annotations

import hmac

import jwt
from allauth.socialaccount.internal import jwtkit
from allauth.socialaccount.providers.oauth2.client import OAuth2Error

from apps.common.errors import StudioError

# Public-key signatures only: an HMAC (HS256...) "signature" made with a key anyone can read (the JWKS) proves
# nothing, and `none` is no signature at all.
SIGNING_ALGORITHMS = frozenset({"RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512",
                                "EdDSA"})
REQUIRED_CLAIMS = ("iss", "sub", "aud", "exp", "iat")


class IdTokenRefused(StudioError, OAuth2Error):
    """An ID token that fails a check: allauth's callback view shows its authentication-error page for it."""

    status = 403


def id_token_claims(*, id_token: str, jwks_uri: str, issuer: str, client_id: str, nonce: str | None) -> dict:
    """The claims of `id_token` once every check passed; IdTokenRefused otherwise, saying which failed. `nonce`:
    the one this login sent (None: the login has none, and no token is accepted)."""
    if not nonce:
        raise IdTokenRefused("This login has no nonce to check the ID token against; start the login again.")
    try:
        header = jwt.get_unverified_header(id_token)
    except jwt.PyJWTError as exc:
        raise IdTokenRefused(f"The ID token is not a signed JWT ({exc}).") from exc
    alg = header.get("alg")
    if alg not in SIGNING_ALGORITHMS:
        raise IdTokenRefused(f"The ID token is signed with {alg!r}; only the provider's public-key signatures "
                             f"({', '.join(sorted(SIGNING_ALGORITHMS))}) are accepted.")
    if not isinstance(header.get("kid"), str):
        raise IdTokenRefused("The ID token names no signing key (kid); the studio finds the provider's key by it.")
    try:
        claims = jwtkit.verify_and_decode(credential=id_token, keys_url=jwks_uri, issuer=issuer, audience=client_id,
                                          lookup_kid=_jwk_with_kid, verify_signature=True)
    except OAuth2Error as exc:
        cause = f": {exc.__cause__}" if exc.__cause__ else ""
        raise IdTokenRefused(f"The ID token was refused ({exc}{cause}).") from exc
    missing = [name for name in REQUIRED_CLAIMS if name not in claims]
    if missing:
        raise IdTokenRefused(f"The ID token lacks {', '.join(missing)}, which every ID token must carry.")
    audiences = claims["aud"] if isinstance(claims["aud"], list) else [claims["aud"]]
    if (len(audiences) > 1 or "azp" in claims) and claims.get("azp") != client_id:
        raise IdTokenRefused(f"The ID token was issued to {claims.get('azp')!r}, not to this studio ({client_id}).")
    if not hmac.compare_digest(str(claims.get("nonce", "")), nonce):
        raise IdTokenRefused("The ID token's nonce is not this login's: it was issued for another login (a replay). "
                             "Log in again.")
    return claims


def _jwk_with_kid(keys_data, kid):
    # allauth's lookup reads d["kid"] of every key: one without (allowed in a JWKS) would be a KeyError.
    keys = [key for key in keys_data.get("keys", []) if isinstance(key, dict) and "kid" in key]
    return jwtkit.lookup_kid_jwk({"keys": keys}, kid)

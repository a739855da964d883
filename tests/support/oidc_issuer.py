"""A real HTTP issuer on loopback for the sign-on tests (tests/apps/sso): its discovery document and its JWKS,
with RSA keys it can rotate, and the signing of tokens with them (or with anything an attacker would try), so
that each attack on the ID token meets the studio's real verification, JWKS fetch included.

It also answers the code flow's back channel (the token endpoint and UserInfo) for codes a test grants
(`issuer.grant(claims)`), so that a test can walk a whole login through the studio's real views without a browser:
the test plays the person's browser and the provider's login page (it reads the nonce, state and PKCE challenge
from the studio's redirect). The browser walk through a certified provider's own pages is tests/e2e/test_sso_oidc.py.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


class SigningKey:
    def __init__(self, kid: str):
        self.kid = kid
        self.private = rsa.generate_private_key(public_exponent=65537, key_size=2048)

    @property
    def jwk(self) -> dict:
        return {**json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(self.private.public_key())), "kid": self.kid,
                "use": "sig", "alg": "RS256"}

    @property
    def public_pem(self) -> bytes:
        return self.private.public_key().public_bytes(serialization.Encoding.PEM,
                                                      serialization.PublicFormat.SubjectPublicKeyInfo)


class LoopbackIssuer:
    """issuer.url is the issuer; issuer.keys the published (current) keys, issuer.rotate() publishes a new one
    and drops the old."""

    def __init__(self, client_id: str = "studio"):
        self.client_id = client_id
        self.keys = [SigningKey("key-1")]
        self.grants: dict[str, dict] = {}  # code -> the claims of the ID token it is redeemed for (once)
        self.redeemed: dict[str, dict] = {}  # code -> the token request's form (code_verifier...)
        self._userinfo: dict[str, dict] = {}  # access token -> UserInfo
        issuer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                if self.path == "/.well-known/openid-configuration":
                    body = {"issuer": issuer.url, "jwks_uri": f"{issuer.url}/jwks",
                            "authorization_endpoint": f"{issuer.url}/auth", "token_endpoint": f"{issuer.url}/token",
                            "userinfo_endpoint": f"{issuer.url}/me", "id_token_signing_alg_values_supported": ["RS256"]}
                elif self.path == "/jwks":
                    body = {"keys": [key.jwk for key in issuer.keys]}
                elif self.path == "/me" and (info := issuer._userinfo.get(
                        self.headers.get("Authorization", "").removeprefix("Bearer "))):
                    body = info
                else:
                    self.send_error(404)
                    return
                self._answer(body)

            def do_POST(self):
                form = {k: v[0] for k, v in parse_qs(self.rfile.read(int(self.headers["Content-Length"])).decode())
                        .items()}
                claims = issuer.grants.pop(form.get("code", ""), None) if self.path == "/token" else None
                if claims is None:
                    self.send_error(400, "invalid_grant")
                    return
                issuer.redeemed[form["code"]] = form
                access_token = secrets.token_urlsafe(16)
                issuer._userinfo[access_token] = {"sub": claims["sub"]}
                self._answer({"access_token": access_token, "token_type": "Bearer", "expires_in": 300,
                              "id_token": issuer.sign(claims)})

            def _answer(self, body: dict):
                data = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self._http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._http.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._http.server_address[1]}"
        self._thread = threading.Thread(target=self._http.serve_forever, name="oidc-issuer", daemon=True)
        self._thread.start()

    @property
    def jwks_uri(self) -> str:
        return f"{self.url}/jwks"

    def stop(self) -> None:
        self._http.shutdown()
        self._http.server_close()

    def grant(self, claims: dict) -> str:
        """A code the token endpoint redeems once, for an ID token of `claims` (signed with the current key)."""
        code = secrets.token_urlsafe(16)
        self.grants[code] = claims
        return code

    def rotate(self, kid: str) -> SigningKey:
        self.keys = [SigningKey(kid)]
        return self.keys[0]

    def claims(self, **changes) -> dict:
        now = int(time.time())
        claims = {"iss": self.url, "sub": "user-1", "aud": self.client_id, "iat": now, "exp": now + 300,
                  "nonce": "the-nonce", "groups": ["ml-team"]}
        claims.update(changes)
        return {name: value for name, value in claims.items() if value is not None}  # None: leave the claim out

    def sign(self, claims: dict, *, key: SigningKey | None = None, kid: str | None = None) -> str:
        key = key or self.keys[0]
        return jwt.encode(claims, key.private, algorithm="RS256", headers={"kid": kid or key.kid})

    @staticmethod
    def unsigned(claims: dict, kid: str) -> str:
        """alg none: a token with no signature at all."""
        header = b64url(json.dumps({"alg": "none", "typ": "JWT", "kid": kid}).encode())
        return f"{header}.{b64url(json.dumps(claims).encode())}."

    @staticmethod
    def hmac_signed(claims: dict, secret: bytes, kid: str) -> str:
        """HS256 with `secret` as the HMAC key: with the issuer's public key as the secret, the classic algorithm
        confusion (a verifier that takes the token's alg would check it with the public key, and pass it)."""
        header = b64url(json.dumps({"alg": "HS256", "typ": "JWT", "kid": kid}).encode())
        signing_input = f"{header}.{b64url(json.dumps(claims).encode())}"
        signature = hmac.new(secret, signing_input.encode(), hashlib.sha256).digest()
        return f"{signing_input}.{b64url(signature)}"

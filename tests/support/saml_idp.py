"""A SAML 2.0 identity provider on loopback for the browser tests: pysaml2's IdP (saml2.server.Server, the protocol
side of pysaml2's own example IdP) behind a small WSGI app of ours that is only its login page. It reads the
studio's AuthnRequest (HTTP-Redirect binding), asks for a user name and password on its own page, and posts a
response whose assertion pysaml2 signs with xmlsec1 (Debian's xmlsec1, which make setup installs) back to the
studio's ACS (HTTP-POST binding). People and their groups are a dict the test changes as it goes."""

from __future__ import annotations

import html
import threading
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import parse_qs
from wsgiref.simple_server import WSGIRequestHandler, make_server

from saml2 import BINDING_HTTP_POST, BINDING_HTTP_REDIRECT
from saml2.config import IdPConfig
from saml2.saml import NAME_FORMAT_BASIC, NAMEID_FORMAT_PERSISTENT, NameID
from saml2.server import Server
from saml2.xmldsig import DIGEST_SHA256, SIG_RSA_SHA256

from tests.support.saml import SigningKey

XMLSEC = "/usr/bin/xmlsec1"


@dataclass
class Person:
    password: str
    email: str
    groups: list[str] = field(default_factory=list)


class _Quiet(WSGIRequestHandler):
    def log_message(self, *args):
        pass


class SamlIdentityProvider:
    """Started with `start(sp_metadata)`; `url` and `entity_id` are what the studio's settings name."""

    def __init__(self, *, key: SigningKey, people: dict[str, Person], workdir: Path):
        self.people = people
        self.key = key
        self.workdir = workdir
        self.server = make_server("127.0.0.1", 0, self.app, handler_class=_Quiet)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        self.entity_id = f"{self.url}/idp"
        self.sso_url = f"{self.url}/sso"
        self.idp: Server | None = None

    def start(self, *, sp_metadata: str) -> None:
        key_file, cert_file = self.workdir / "idp.key", self.workdir / "idp.crt"
        key_file.write_text(self.key.key_pem)
        cert_file.write_text(self.key.cert_pem)
        config = IdPConfig()
        config.load({
            "entityid": self.entity_id,
            "service": {"idp": {
                "endpoints": {"single_sign_on_service": [(self.sso_url, BINDING_HTTP_REDIRECT)]},
                "name_id_format": [NAMEID_FORMAT_PERSISTENT],
                "sign_assertion": True, "sign_response": False,
                "policy": {"default": {"lifetime": {"minutes": 5}, "attribute_restrictions": None,
                                       "name_form": NAME_FORMAT_BASIC}},
            }},
            "key_file": str(key_file), "cert_file": str(cert_file), "xmlsec_binary": XMLSEC,
            "metadata": {"inline": [sp_metadata]},
        })
        self.idp = Server(config=config)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    # --- the WSGI app: its login page, and the response it posts back ---------------------------------------

    def app(self, environ, start_response):
        if environ["PATH_INFO"] == "/sso" and environ["REQUEST_METHOD"] == "GET":
            query = parse_qs(environ.get("QUERY_STRING", ""))
            return self._page(start_response, self._login_form(query["SAMLRequest"][0],
                                                               query.get("RelayState", [""])[0], error=""))
        if environ["PATH_INFO"] == "/login" and environ["REQUEST_METHOD"] == "POST":
            size = int(environ.get("CONTENT_LENGTH") or 0)
            form = {k: v[0] for k, v in parse_qs(environ["wsgi.input"].read(size).decode()).items()}
            return self._page(start_response, self._answer(form))
        start_response("404 Not Found", [("Content-Type", "text/plain")])
        return [b"not found"]

    def _page(self, start_response, body: str):
        start_response("200 OK", [("Content-Type", "text/html; charset=utf-8")])
        return [body.encode()]

    def _login_form(self, saml_request: str, relay_state: str, *, error: str) -> str:
        hidden = "".join(f'<input type="hidden" name="{n}" value="{html.escape(v)}">'
                         for n, v in (("SAMLRequest", saml_request), ("RelayState", relay_state)))
        return (f"<html><body><h1>Test IdP sign-in</h1><p class=error>{html.escape(error)}</p>"
                f'<form method="post" action="/login">{hidden}'
                '<label>User <input name="username"></label><label>Password <input name="password" '
                'type="password"></label><button type="submit">Sign in</button></form></body></html>')

    def _answer(self, form: dict) -> str:
        person = self.people.get(form.get("username", ""))
        if person is None or person.password != form.get("password"):
            return self._login_form(form["SAMLRequest"], form.get("RelayState", ""), error="Wrong user or password")
        request = self.idp.parse_authn_request(form["SAMLRequest"], BINDING_HTTP_REDIRECT).message
        sp = request.issuer.text
        destination = request.assertion_consumer_service_url or self.idp.config.metadata.assertion_consumer_service(
            sp, binding=BINDING_HTTP_POST)[0]["location"]
        identity = {"uid": [form["username"]], "mail": [person.email], "memberOf": list(person.groups)}
        response = self.idp.create_authn_response(
            identity, in_response_to=request.id, destination=destination, sp_entity_id=sp,
            name_id=NameID(format=NAMEID_FORMAT_PERSISTENT, text=f"id-{form['username']}"),
            userid=form["username"], sign_assertion=True, sign_response=False,
            authn={"class_ref": "urn:oasis:names:tc:SAML:2.0:ac:classes:Password"},
            sign_alg=SIG_RSA_SHA256, digest_alg=DIGEST_SHA256)  # pysaml2's default, SHA-1, the studio refuses
        posted = self.idp.apply_binding(BINDING_HTTP_POST, str(response), destination,
                                        form.get("RelayState", ""), response=True)
        # pysaml2's page posts itself with a script; the button is there for a browser that runs none.
        return posted["data"].replace("</form>", '<button type="submit">Continue to the studio</button></form>')

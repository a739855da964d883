"""SAML 2.0 for the tests: an identity provider's signing key and certificate made for the test, and responses
built as an IdP builds them and signed with python3-saml and xmlsec (the stack the studio checks them with), so a
test can post a real signed response, or a forged one, to the studio's own ACS view."""

from __future__ import annotations

import base64
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from xml.sax.saxutils import escape, quoteattr

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID
from onelogin.saml2.utils import OneLogin_Saml2_Utils


@dataclass(frozen=True)
class SigningKey:
    key_pem: str
    cert_pem: str

    @property
    def cert_body(self) -> str:
        """The certificate as SAML settings and metadata carry it: base64 without the PEM lines."""
        return "".join(line for line in self.cert_pem.splitlines() if "-----" not in line)


def signing_key(common_name: str = "test-idp") -> SigningKey:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = datetime.now(UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - timedelta(days=1))
            .not_valid_after(now + timedelta(days=30)).sign(key, hashes.SHA256()))
    return SigningKey(
        key_pem=key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                  serialization.NoEncryption()).decode(),
        cert_pem=cert.public_bytes(serialization.Encoding.PEM).decode())


def _instant(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def assertion_xml(*, issuer: str, name_id: str, audience: str | None, recipient: str | None,
                  in_response_to: str | None, attributes: dict[str, list[str]],
                  lifetime: timedelta = timedelta(minutes=5), issued: datetime | None = None,
                  assertion_id: str | None = None, confirmation_expiry: bool = True) -> str:
    issued = issued or datetime.now(UTC)
    until = _instant(issued + lifetime)
    confirmation = " ".join(f"{name}={quoteattr(value)}" for name, value in (
        ("InResponseTo", in_response_to), ("NotOnOrAfter", until if confirmation_expiry else None),
        ("Recipient", recipient)) if value)
    audience_xml = (f"<saml:AudienceRestriction><saml:Audience>{escape(audience)}</saml:Audience>"
                    f"</saml:AudienceRestriction>") if audience else ""
    values = "".join(
        f'<saml:Attribute Name={quoteattr(name)} NameFormat="urn:oasis:names:tc:SAML:2.0:attrname-format:basic">'
        + "".join(f'<saml:AttributeValue xsi:type="xs:string">{escape(v)}</saml:AttributeValue>' for v in vals)
        + "</saml:Attribute>" for name, vals in attributes.items())
    return (
        '<saml:Assertion xmlns:saml="urn:oasis:names:tc:SAML:2.0:assertion" '
        'xmlns:xs="http://www.w3.org/2001/XMLSchema" xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance" '
        f'ID="{assertion_id or "_a" + uuid.uuid4().hex}" Version="2.0" IssueInstant="{_instant(issued)}">'
        f"<saml:Issuer>{escape(issuer)}</saml:Issuer>"
        "<saml:Subject>"
        f'<saml:NameID Format="urn:oasis:names:tc:SAML:2.0:nameid-format:persistent">{escape(name_id)}</saml:NameID>'
        f'<saml:SubjectConfirmation Method="urn:oasis:names:tc:SAML:2.0:cm:bearer">'
        f"<saml:SubjectConfirmationData {confirmation}/></saml:SubjectConfirmation>"
        "</saml:Subject>"
        f'<saml:Conditions NotBefore="{_instant(issued - timedelta(minutes=1))}" NotOnOrAfter="{until}">'
        f"{audience_xml}</saml:Conditions>"
        f'<saml:AuthnStatement AuthnInstant="{_instant(issued)}" SessionIndex="_s{uuid.uuid4().hex}">'
        "<saml:AuthnContext><saml:AuthnContextClassRef>urn:oasis:names:tc:SAML:2.0:ac:classes:Password"
        "</saml:AuthnContextClassRef></saml:AuthnContext></saml:AuthnStatement>"
        f"<saml:AttributeStatement>{values}</saml:AttributeStatement>"
        "</saml:Assertion>")


def sign(xml: str, key: SigningKey) -> str:
    """`xml` (an assertion or a response) enveloped-signed after its Issuer, RSA-SHA256, as IdPs sign."""
    signed = OneLogin_Saml2_Utils.add_sign(xml, key.key_pem, key.cert_pem)
    return signed.decode() if isinstance(signed, bytes) else signed


def response_b64(*, issuer: str, destination: str, in_response_to: str | None, assertion: str) -> str:
    """A samlp:Response around `assertion` (signed or not), base64 as the HTTP-POST binding sends it. The envelope
    itself is never signed here: an attacker can always write one."""
    irt = f" InResponseTo={quoteattr(in_response_to)}" if in_response_to else ""
    body = ('<samlp:Response xmlns:samlp="urn:oasis:names:tc:SAML:2.0:protocol" '
            'xmlns:saml="urn:oasis:names:tc:SAML:2.0:assertion" '
            f'ID="_r{uuid.uuid4().hex}" Version="2.0" IssueInstant="{_instant(datetime.now(UTC))}" '
            f"Destination={quoteattr(destination)}{irt}>"
            f"<saml:Issuer>{escape(issuer)}</saml:Issuer>"
            '<samlp:Status><samlp:StatusCode Value="urn:oasis:names:tc:SAML:2.0:status:Success"/></samlp:Status>'
            f"{assertion}</samlp:Response>")
    return base64.b64encode(body.encode()).decode()


def request_id(redirect_url: str) -> str:
    """The ID of the AuthnRequest in an HTTP-Redirect binding URL (what the studio sent the IdP)."""
    from urllib.parse import parse_qs, urlsplit

    from onelogin.saml2.xml_utils import OneLogin_Saml2_XML

    saml_request = parse_qs(urlsplit(redirect_url).query)["SAMLRequest"][0]
    document = OneLogin_Saml2_XML.to_etree(OneLogin_Saml2_Utils.decode_base64_and_inflate(saml_request))
    return document.get("ID")

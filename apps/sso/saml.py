"""allauth's SAML 2.0 provider, completed (settings.SOCIALACCOUNT_PROVIDERS["saml"] names this class).

What allauth and python3-saml check, read in their code (allauth 65.22 socialaccount/providers/saml, python3-saml
1.16 onelogin/saml2/response.py), with the settings we give them (studio/settings.py `_saml_provider`: strict,
signed assertions wanted, IdP-initiated logins refused):
- the XML signature against the IdP's certificate; with wantAssertionsSigned, a response whose Assertion is not
  signed is refused (an unsigned assertion inside a signed Response is not enough), one assertion only (no
  signature wrapping);
- Conditions NotBefore/NotOnOrAfter and SubjectConfirmationData NotOnOrAfter (expired), the Issuer, the
  Response's Destination when it has one;
- InResponseTo: allauth keeps the AuthnRequest's state in the session and takes it out once, so a response is
  accepted only in the browser that asked for it, and only once per request there.

What they leave open, checked here before allauth makes the login (AssertionChecks):
- the audience: python3-saml accepts an assertion with no AudienceRestriction at all; we require our entity id
  among its Audiences;
- the recipient: python3-saml accepts a SubjectConfirmationData without Recipient, and one whose Recipient merely
  contains our ACS URL as a substring; we require it equal to our ACS URL;
- expiry of the bearer confirmation: python3-saml accepts a SubjectConfirmationData without NotOnOrAfter (SAML's
  browser profile requires one), so the assertion would be good for as long as its Conditions say, or forever; we
  require it, and it bounds how long an assertion is accepted (python3-saml allows no clock drift past it);
- replay: nothing remembers an assertion. SamlAssertion keeps each accepted assertion's ID until it expires and a
  second use is refused, whichever browser or session presents it.

The person's claims for apps/sso (services.sso_login_admit) come from the assertion: `sub` is the NameID (or the
attribute the operator maps as uid), the groups are the configured attribute's values.
"""

from __future__ import annotations

from datetime import UTC, datetime

from allauth.core.exceptions import ImmediateHttpResponse
from allauth.socialaccount.providers.saml.provider import SAMLProvider
from django.db import IntegrityError, transaction
from django.utils import timezone
from onelogin.saml2.constants import OneLogin_Saml2_Constants
from onelogin.saml2.xml_utils import OneLogin_Saml2_XML

from .adapters import refusal_page
from .models import SamlAssertion


class AssertionRefused(Exception):
    pass


def assertion_check(*, auth, provider_id: str) -> None:
    """The checks python3-saml leaves to us (the module's docstring), on the response it has just validated;
    then the assertion's ID is recorded, so that it is never accepted again. AssertionRefused says what was
    wrong."""
    settings = auth.get_settings()
    sp = settings.get_sp_data()
    document = OneLogin_Saml2_XML.to_etree(auth.get_last_response_xml())
    assertion = OneLogin_Saml2_XML.query(document, "/samlp:Response/saml:Assertion")
    if len(assertion) != 1:
        raise AssertionRefused("the response carries no assertion in the clear (encrypted assertions are not "
                               "configured)")
    audiences = [a.text.strip() for a in OneLogin_Saml2_XML.query(
        assertion[0], "./saml:Conditions/saml:AudienceRestriction/saml:Audience") if a.text]
    if sp["entityId"] not in audiences:
        raise AssertionRefused(f"the assertion is not for this studio: its audience is {audiences or 'missing'}, "
                               f"this studio's entity id is {sp['entityId']}")
    acs = sp["assertionConsumerService"]["url"]
    bearer = f"./saml:Subject/saml:SubjectConfirmation[@Method='{OneLogin_Saml2_Constants.CM_BEARER}']"
    recipients = [data.get("Recipient")
                  for data in OneLogin_Saml2_XML.query(assertion[0], bearer + "/saml:SubjectConfirmationData")]
    if acs not in recipients:
        raise AssertionRefused(f"the assertion was not sent to this studio: its recipient is "
                               f"{[r for r in recipients if r] or 'missing'}, this studio's ACS is {acs}")
    assertion_id = auth.get_last_assertion_id()
    if not assertion_id:
        raise AssertionRefused("the assertion has no ID")
    expires = auth.get_last_assertion_not_on_or_after()
    if not expires:
        raise AssertionRefused("its bearer confirmation names no expiry (SubjectConfirmationData NotOnOrAfter, which "
                               "SAML's browser profile requires), so nothing would bound how long it is good for")
    # python3-saml accepts the assertion only before this instant (no drift), so its ID need be kept only until then.
    keep_until = datetime.fromtimestamp(expires, tz=UTC)
    SamlAssertion.objects.filter(keep_until__lt=timezone.now()).delete()
    try:
        with transaction.atomic():
            SamlAssertion.objects.create(provider=provider_id, assertion_id=assertion_id[:255],
                                         keep_until=keep_until)
    except IntegrityError:
        raise AssertionRefused(f"the assertion {assertion_id} was already used to log in: a replayed assertion "
                               "is refused") from None


class StudioSAMLProvider(SAMLProvider):
    # allauth finds a provider's views by its package: ours are allauth's own (its saml/urls.py).
    package = "allauth.socialaccount.providers.saml"

    def sociallogin_from_response(self, request, response):
        try:
            assertion_check(auth=response, provider_id=self.sub_id)
        except AssertionRefused as exc:
            raise ImmediateHttpResponse(refusal_page(request, f"{self.name} sent a SAML response the studio "
                                                              f"refuses: {exc}. Log in again from the start."))
        return super().sociallogin_from_response(request, response)

    def extract_extra_data(self, data):
        """The claims apps/sso reads (selectors.login_claims): sub, the NameID (`nameid`, which a first login's link
        to a SCIM-provisioned person compares with their userName), the person's names and address, their groups
        under the configured attribute's name, and every attribute as the IdP sent it."""
        attributes = data.get_attributes()
        common = self._extract(data)
        claims = {name: list(values) for name, values in attributes.items()}
        claims.update({"sub": self.extract_uid(data), "nameid": data.get_nameid(), "email": common.get("email", ""),
                       "given_name": common.get("first_name", ""), "family_name": common.get("last_name", ""),
                       "preferred_username": common.get("username") or self.extract_uid(data)})
        return claims


"""Who may call /scim/v2: the holder of a live API token of the SCIM scope, and no one else (not a signed-in
browser, not a project token). Kept apart from scim.py because django-scim2 imports it while it defines its views
(the AUTH_CHECK_MIDDLEWARE setting)."""

import json

from django.http import HttpResponse
from django_scim import constants
from django_scim.middleware import SCIMAuthCheckMiddleware

from apps.accounts.selectors import scim_token_for_plaintext

from .selectors import sign_on_providers


def scim_error(detail: str, *, status: int, scim_type: str | None = None) -> HttpResponse:
    """An RFC 7644 section 3.12 error body."""
    body = {"schemas": [constants.SchemaURI.ERROR], "detail": detail, "status": str(status)}
    if scim_type:
        body["scimType"] = scim_type
    return HttpResponse(json.dumps(body), status=status, content_type=constants.SCIM_CONTENT_TYPE)


class SCIMTokenAuth(SCIMAuthCheckMiddleware):
    """`Authorization: Bearer pts_...` of a live SCIM token (TokenScope.SCIM) of a configured identity provider. The
    request then acts as the token's holder (request.user), whom the audit rows name, via "scim", for the token's
    provider (request.scim_token.provider); whoever the session cookie says is ignored."""

    def process_request(self, request):
        scheme, _, plaintext = request.headers.get("Authorization", "").partition(" ")
        token = scim_token_for_plaintext(plaintext=plaintext.strip()) if scheme.lower() == "bearer" else None
        if token is None:
            response = scim_error("A SCIM token is needed: send `Authorization: Bearer pts_...` with a live token "
                                  "of the scim scope (an operator makes one with `manage.py scim_token create`).",
                                  status=401)
            response["WWW-Authenticate"] = 'Bearer realm="scim"'
            return response
        logins = {pid for pid, p in sign_on_providers().items() if p["protocol"] in ("oidc", "saml")}
        if token.provider not in logins:
            # The provider was taken out of the configuration (or the token predates providers): its people would
            # be nobody's, so the token provisions nothing until an operator makes one for a configured provider.
            return scim_error(f"This SCIM token belongs to the identity provider {token.provider or 'none'!r}, which "
                              "is not configured here: an operator makes a token for a configured one with "
                              "`manage.py scim_token create --provider <id>`.", status=401)
        request.user = token.user
        request.scim_token = token
        return None


def base_location(request=None, *args, **kwargs) -> str:
    """Resources' meta.location: the address the identity provider called (django-scim2's default needs a fixed
    NETLOC setting)."""
    return request.build_absolute_uri("/") if request is not None else "/"

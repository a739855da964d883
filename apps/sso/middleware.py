from urllib.parse import urlsplit

from django.conf import settings
from django.contrib.auth import logout
from django.shortcuts import render

from apps.accounts.models import Membership

# The provider a session's person signed on through (set at login by adapters.StudioAccountAdapter.post_login).
SIGNED_ON_VIA = "sso_provider"
API_PREFIX = "/api/"


class SignOnRecheck:
    """A person who signed on through an identity provider keeps their session only while they hold a role in
    some project: when their groups stop mapping to any (a mapping removed, SCIM taking them out of a group), their
    next request signs them out, with the refusal page (an API call is answered 401, as any signed-out one).
    Deactivated users are signed out by Django itself (ModelBackend.get_user refuses them)."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        provider = request.session.get(SIGNED_ON_VIA) if request.user.is_authenticated else None
        if provider and not Membership.objects.filter(user=request.user).exists():
            username = request.user.get_username()
            logout(request)
            if not request.path.startswith(API_PREFIX):
                return render(request, "sso/refused.html", {
                    "reason": f"{username} no longer holds a role in any project here: your groups at the identity "
                              "provider do not map to one anymore. Ask a project owner if you should still have "
                              "access; then log in again."}, status=403)
        return self.get_response(request)


class LoginFormsReachProviders:
    """The login page's provider buttons post to the studio, which redirects the browser to the provider; the
    Content-Security-Policy's form-action 'self' would stop that redirect (browsers check a form's redirects too).
    On the login pages only, the configured providers' origins are allowed as well. Inside CSPMiddleware, which
    reads `_csp_update` from the response."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        response = self.get_response(request)
        if request.path.startswith((settings.LOGIN_URL, "/accounts/sso/")):
            providers = settings.SOCIALACCOUNT_PROVIDERS
            # A SAML IdP's single sign-on URL (given, or where its metadata is served: the IdP's own host).
            origins = sorted({_origin(app["settings"]["issuer"]) for app in providers["openid_connect"]["APPS"]}
                             | {_origin(app["settings"]["idp"].get("sso_url") or app["settings"]["idp"]["metadata_url"])
                                for app in providers.get("saml", {}).get("APPS", [])})
            if origins:
                update = getattr(response, "_csp_update", None) or {}
                response._csp_update = {**update, "form-action": [*update.get("form-action", []), *origins]}
        return response


def _origin(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"

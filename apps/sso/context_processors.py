from django.conf import settings
from django.urls import reverse

from .selectors import sign_on_providers

# The login URL of each protocol's provider (allauth's URL names; apps/sso/login_urls.py mounts them).
LOGIN_URL_NAMES = {"oidc": "openid_connect_login", "saml": "saml_login"}

# allauth's SAML views name their provider `organization_slug`.
LOGIN_URL_KWARG = {"oidc": "provider_id", "saml": "organization_slug"}


def login_url(provider_id: str, protocol: str) -> str:
    return reverse(LOGIN_URL_NAMES[protocol], kwargs={LOGIN_URL_KWARG[protocol]: provider_id})


def sign_on(request):
    """What the login page offers: a button per identity provider, and the password form unless passwords are
    switched off (then only at ?break-glass, for STUDIO_BREAK_GLASS_USER)."""
    if not request.path.startswith(settings.LOGIN_URL):
        return {}
    return {"sign_on_providers": [{"name": p["name"], "login_url": login_url(pid, p["protocol"])}
                                  for pid, p in sign_on_providers().items() if p["protocol"] in LOGIN_URL_NAMES],
            "local_login": settings.LOCAL_LOGIN,
            "break_glass": "break-glass" in request.GET and bool(settings.BREAK_GLASS_USER)}

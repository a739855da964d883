"""allauth's OpenID Connect provider, completed (settings.SOCIALACCOUNT_PROVIDERS names this class): a nonce in
every authorization request, bound to the login's one-time state; the code flow always with PKCE (S256, the
providers' setting); logins only (allauth's "connect" process, which would link a provider account to whoever is
signed in, is not offered). Its login and callback are this package's urls.py, mounted by apps/sso/urls.py."""

import secrets

from allauth.socialaccount.providers.base import AuthProcess
from allauth.socialaccount.providers.openid_connect.provider import OpenIDConnectProvider

from .views import NONCE_STATE_KEY, StudioOpenIDConnectAdapter


class StudioOpenIDConnectProvider(OpenIDConnectProvider):
    oauth2_adapter_class = StudioOpenIDConnectAdapter
    supports_token_authentication = False  # allauth's headless "log in with an ID token" is not offered

    def get_redirect_from_request_kwargs(self, request):
        kwargs = super().get_redirect_from_request_kwargs(request)
        kwargs["process"] = AuthProcess.LOGIN
        return kwargs

    def redirect(self, request, process, next_url=None, data=None, **kwargs):
        nonce = secrets.token_urlsafe(32)
        auth_params = kwargs.pop("auth_params", None)
        auth_params = {**(self.get_auth_params() if auth_params is None else auth_params), "nonce": nonce}
        # The nonce goes into the login's stashed state (the session), which the callback takes out once.
        return super().redirect(request, process, next_url, data, auth_params=auth_params,
                                **{NONCE_STATE_KEY: nonce}, **kwargs)


provider_classes = [StudioOpenIDConnectProvider]

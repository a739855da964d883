"""The OpenID Connect login and callback: allauth's views with StudioOpenIDConnectAdapter, which checks every ID
token (tokens.py) against the configured issuer and this login's nonce."""

from __future__ import annotations

from allauth.account.internal.decorators import login_not_required
from allauth.socialaccount.models import SocialApp
from allauth.socialaccount.providers.oauth2.client import OAuth2Error
from allauth.socialaccount.providers.oauth2.views import OAuth2CallbackView, OAuth2LoginView
from allauth.socialaccount.providers.openid_connect.views import OpenIDConnectOAuth2Adapter
from django.http import Http404

from .tokens import IdTokenRefused, id_token_claims

NONCE_STATE_KEY = "oidc_nonce"  # where StudioOpenIDConnectProvider.redirect stashes the login's nonce


class StudioOpenIDConnectAdapter(OpenIDConnectOAuth2Adapter):
    nonce: str | None = None  # this login's, from its stashed state (StudioCallbackView)

    @property
    def openid_config(self):
        config = super().openid_config
        # OpenID Connect Discovery 4.3: the document must name the issuer it was fetched for. allauth takes whatever
        # issuer the document names, and checks ID tokens against that.
        issuer = self.get_provider().app.settings["issuer"]
        if config.get("issuer", "").rstrip("/") != issuer:
            raise OAuth2Error(f"The provider's discovery document names the issuer {config.get('issuer')!r}, not the "
                              f"configured {issuer!r}: check STUDIO_OIDC_*_ISSUER.")
        return config

    def complete_login(self, request, app, token, **kwargs):
        id_token = kwargs["response"].get("id_token")
        if not id_token:
            raise IdTokenRefused("The provider answered without an ID token: is the 'openid' scope requested?")
        data = {"id_token": self._decode_id_token(app, id_token)}
        if app.settings.get("fetch_userinfo", True):
            userinfo = self._fetch_user_info(token.token)
            # OpenID Connect Core 5.3.2: the UserInfo response is about the ID token's subject, or it is not used.
            if userinfo.get("sub") != data["id_token"]["sub"]:
                raise IdTokenRefused("The provider's UserInfo is about another subject than its ID token.")
            data["userinfo"] = userinfo
        return self.get_provider().sociallogin_from_response(request, data)

    def _decode_id_token(self, app, id_token: str) -> dict:
        # Always against the JWKS: allauth skips the signature of a token fetched from the token endpoint.
        return id_token_claims(id_token=id_token, jwks_uri=self.openid_config["jwks_uri"],
                               issuer=app.settings["issuer"], client_id=app.client_id, nonce=self.nonce)


class StudioCallbackView(OAuth2CallbackView):
    def _get_state(self, request, provider):
        # allauth takes the login's state out of the session here (once: a replayed callback finds none); the
        # nonce stashed with it is what the ID token must carry. (A private method of the pinned allauth.)
        state, response = super()._get_state(request, provider)
        self.adapter.nonce = (state or {}).get(NONCE_STATE_KEY)
        return state, response


@login_not_required
def login(request, provider_id):
    try:
        return OAuth2LoginView.adapter_view(StudioOpenIDConnectAdapter(request, provider_id))(request)
    except SocialApp.DoesNotExist:
        raise Http404(f"No identity provider {provider_id!r}.")


@login_not_required
def callback(request, provider_id):
    try:
        return StudioCallbackView.adapter_view(StudioOpenIDConnectAdapter(request, provider_id))(request)
    except SocialApp.DoesNotExist:
        raise Http404(f"No identity provider {provider_id!r}.")

"""How allauth's login flow meets the studio (settings.ACCOUNT_ADAPTER, SOCIALACCOUNT_ADAPTER): once the provider
vouched for a person (the ID token checked: oidc/tokens.py), services.sso_login_admit decides whether they are
admitted and with which roles; allauth's own sign-up (a form asking the person for a user name) never runs."""

from allauth.account.adapter import DefaultAccountAdapter
from allauth.core.exceptions import ImmediateHttpResponse
from allauth.socialaccount.adapter import DefaultSocialAccountAdapter
from allauth.socialaccount.models import SocialAccount
from django.shortcuts import render

from .middleware import SIGNED_ON_VIA
from .selectors import login_claims, sign_on_providers
from .services import SsoRefused, sso_login_admit


def refusal_page(request, reason: str):
    return render(request, "sso/refused.html", {"reason": reason}, status=403)


class StudioAccountAdapter(DefaultAccountAdapter):
    def is_open_for_signup(self, request) -> bool:
        return False  # accounts are made by an owner, or just in time by sign-on: never by a sign-up form

    def post_login(self, request, user, **kwargs):
        response = super().post_login(request, user, **kwargs)
        sociallogin = (kwargs.get("signal_kwargs") or {}).get("sociallogin")
        if sociallogin is not None:
            request.session[SIGNED_ON_VIA] = sociallogin.account.provider  # middleware.SignOnRecheck reads it
        return response


class StudioSocialAccountAdapter(DefaultSocialAccountAdapter):
    def is_open_for_signup(self, request, sociallogin) -> bool:
        return False  # pre_social_login has made the account (or refused): allauth's sign-up is never needed

    def pre_social_login(self, request, sociallogin) -> None:
        provider = sociallogin.account.provider
        settings_of = sign_on_providers().get(provider)
        if settings_of is None:
            raise ImmediateHttpResponse(refusal_page(request, f"No identity provider {provider!r} is configured."))
        try:
            user = sso_login_admit(provider=provider, claims=login_claims(sociallogin.account.extra_data),
                                   groups_claim=settings_of["groups_claim"])
        except SsoRefused as exc:
            raise ImmediateHttpResponse(refusal_page(request, str(exc)))
        if not sociallogin.is_existing:  # made just now: allauth logs in the account sso_login_admit made
            sociallogin.account = SocialAccount.objects.get(provider=provider, uid=sociallogin.account.uid)
            sociallogin.user = user

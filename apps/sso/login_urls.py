"""The sign-on flows, under /accounts/sso/ (open to people not logged in: apps/accounts/middleware.py): each
protocol's login and callback, and allauth's pages for a login that failed or was cancelled."""

from allauth.socialaccount import views as socialaccount_views
from django.urls import include, path

urlpatterns = [
    path("", include("apps.sso.oidc.urls")),
    # allauth's SAML views (saml/<id>/login/, acs/, acs/finish/, metadata/, sls/), run by apps/sso/saml.py's provider.
    path("", include("allauth.socialaccount.providers.saml.urls")),
    path("login/error/", socialaccount_views.login_error, name="socialaccount_login_error"),
    path("login/cancelled/", socialaccount_views.login_cancelled, name="socialaccount_login_cancelled"),
]

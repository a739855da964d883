from django.urls import path

from . import views

# allauth reverses these names (its provider's `{provider}_login` and `_callback`); mounted under /accounts/sso/.
urlpatterns = [
    path("oidc/<str:provider_id>/login/", views.login, name="openid_connect_login"),
    path("oidc/<str:provider_id>/login/callback/", views.callback, name="openid_connect_callback"),
]

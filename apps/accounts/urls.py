from django.contrib.auth import views as auth_views
from django.urls import path

from . import views

# Only login and logout from django.contrib.auth: password resets need mail, which the studio does not send.
urlpatterns = [
    path("login/", auth_views.LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("tokens/", views.api_tokens, name="api_tokens"),
    path("tokens/<int:token_id>/revoke/", views.api_token_revoke, name="api_token_revoke"),
    path("audit/<slug:project>/", views.audit_log, name="audit_log"),
]

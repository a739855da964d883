from django.contrib import admin
from django.urls import include, path

from apps.operations import metrics

from .api import api

urlpatterns = [
    path("metrics", metrics.metrics, name="metrics"),
    path("healthz", metrics.healthz, name="healthz"),
    path("readyz", metrics.readyz, name="readyz"),
    path("accounts/sso/", include("apps.sso.login_urls")),
    path("accounts/", include("apps.accounts.urls")),
    path("admin/", admin.site.urls),
    path("api/v1/", api.urls),
    # SCIM 2.0 provisioning for the identity provider (apps/sso/scim.py), its own bearer token of the scim scope.
    path("scim/v2/", include("apps.sso.scim_urls")),
    path("", include("apps.runs.urls")),
    path("", include("apps.trajectories.urls")),
    path("", include("apps.review.urls")),
    path("", include("apps.datasets.urls")),
    path("", include("apps.evals.urls")),
    path("", include("apps.explorer.urls")),
    path("", include("apps.authoring.urls")),
    path("", include("apps.task_import.urls")),
    path("", include("apps.registry.urls")),
    path("", include("apps.sso.urls")),
]

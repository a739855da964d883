from django.contrib import admin
from django.urls import include, path

from .api import api

urlpatterns = [
    path("accounts/", include("apps.accounts.urls")),
    path("admin/", admin.site.urls),
    path("api/v1/", api.urls),
    path("", include("apps.runs.urls")),
    path("", include("apps.trajectories.urls")),
    path("", include("apps.review.urls")),
    path("", include("apps.evals.urls")),
    path("", include("apps.explorer.urls")),
    path("", include("apps.authoring.urls")),
    path("", include("apps.registry.urls")),
]

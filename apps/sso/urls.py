from django.urls import path

from . import views

app_name = "sso"

urlpatterns = [
    path("p/<slug:project>/members/", views.members, name="members"),
]

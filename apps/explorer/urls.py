from django.urls import path, re_path

from . import views

app_name = "explorer"

# Every Dash request (the page, its layout and dependencies, callbacks, component bundles) comes through here.
urlpatterns = [
    path("p/<slug:project>/explore/", views.explorer, {"rest": ""}, name="index"),
    re_path(r"^p/(?P<project>[-a-z0-9]+)/explore/(?P<rest>.+)$", views.explorer, name="dash"),
]

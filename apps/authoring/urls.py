from django.urls import path

from . import views

app_name = "authoring"

urlpatterns = [
    path("p/<slug:project>/playground/verifier/<slug:slug>/", views.verifier_playground, name="verifier_playground"),
    path("p/<slug:project>/playground/template/<slug:slug>/", views.template_playground, name="template_playground"),
]

from django.urls import path

from . import views

app_name = "registry"

definition = "p/<slug:project>/registry/<str:kind>/<slug:slug>/"

urlpatterns = [
    path("p/<slug:project>/registry/", views.definition_list, name="definition_list"),
    path("p/<slug:project>/registry/new/", views.definition_create, name="definition_create"),
    path("p/<slug:project>/registry/validate/", views.spec_validate, name="spec_validate"),
    path(definition, views.definition_detail, name="definition_detail"),
    path(definition + "@<int:number>/", views.version_detail, name="version_detail"),
    path(definition + "diff/", views.version_diff, name="version_diff"),
    path(definition + "edit/", views.version_edit, name="version_edit"),
    path(definition + "aliases/", views.alias_set, name="alias_set"),
]

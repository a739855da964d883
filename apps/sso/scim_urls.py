"""/scim/v2/: django-scim2's routes (its URL names, which its views reverse), on our Users and Groups views."""

from django.urls import re_path
from django_scim import views as scim_views

from . import scim

app_name = "scim"

urlpatterns = [
    re_path(r"^$", scim_views.SCIMView.as_view(implemented=False), name="root"),
    re_path(r"^\.search$", scim_views.SearchView.as_view(implemented=False), name="search"),
    re_path(r"^Users/\.search$", scim_views.UserSearchView.as_view(), name="users-search"),
    re_path(r"^Users(?:/(?P<uuid>[^/]+))?$", scim.UsersView.as_view(), name="users"),
    re_path(r"^Groups/\.search$", scim_views.GroupSearchView.as_view(), name="groups-search"),
    re_path(r"^Groups(?:/(?P<uuid>[^/]+))?$", scim.GroupsView.as_view(), name="groups"),
    re_path(r"^Me$", scim_views.SCIMView.as_view(implemented=False), name="me"),
    re_path(r"^ServiceProviderConfig$", scim_views.ServiceProviderConfigView.as_view(),
            name="service-provider-config"),
    re_path(r"^ResourceTypes(?:/(?P<uuid>[^/]+))?$", scim_views.ResourceTypesView.as_view(), name="resource-types"),
    re_path(r"^Schemas(?:/(?P<uuid>[^/]+))?$", scim_views.SchemasView.as_view(), name="schemas"),
    re_path(r"^Bulk$", scim_views.SCIMView.as_view(implemented=False), name="bulk"),
]

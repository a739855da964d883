from django.urls import path

from . import views

app_name = "datasets"

version = "p/<slug:project>/datasets/<slug:slug>/<int:number>/"

urlpatterns = [
    path("p/<slug:project>/datasets/", views.dataset_list, name="list"),
    path("p/<slug:project>/datasets/new/", views.dataset_new, name="new"),
    path(version, views.dataset_version, name="version"),
    path(version + "rows.jsonl", views.dataset_download, name="download"),
    path(version + "rebuild/", views.dataset_rebuild, name="rebuild"),
]

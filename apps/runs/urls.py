from django.urls import path

from . import views

app_name = "runs"

run = "p/<slug:project>/runs/<uuid:run_id>/"

urlpatterns = [
    path("", views.home, name="home"),
    path("p/<slug:project>/runs/", views.run_list, name="run_list"),
    path("p/<slug:project>/runs/new/", views.run_new, name="run_new"),
    path("p/<slug:project>/runs/new/domains.json", views.run_new_domains, name="run_new_domains"),
    path("p/<slug:project>/runs/compare/", views.run_compare, name="run_compare"),
    path(run, views.run_detail, name="run_detail"),
    path(run + "history.json", views.run_history, name="run_history"),
    path(run + "domains.json", views.run_domains, name="run_domains"),
    path(run + "control/", views.run_control, name="run_control"),
]

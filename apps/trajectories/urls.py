from django.urls import path

from . import views

app_name = "trajectories"

trajectory = "p/<slug:project>/trajectories/<uuid:trajectory_id>/"

urlpatterns = [
    path("p/<slug:project>/trajectories/", views.trajectory_list, name="trajectory_list"),
    path(trajectory, views.trajectory_detail, name="trajectory_detail"),
    path(trajectory + "vs/<uuid:other_id>/", views.trajectory_compare, name="trajectory_compare"),
    path(trajectory + "artifacts/<path:name>", views.artifact, name="artifact"),
]

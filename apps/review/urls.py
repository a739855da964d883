from django.urls import path

from . import views

app_name = "review"

queue = "p/<slug:project>/review/<slug:queue>/"

urlpatterns = [
    path("p/<slug:project>/review/", views.queue_list, name="queue_list"),
    path("p/<slug:project>/review/queues/new/", views.queue_new, name="queue_new"),
    path("p/<slug:project>/review/verifiers/<slug:slug>/", views.verifier_page, name="verifier"),
    path(queue, views.queue_page, name="queue"),
    path(queue + "next/", views.queue_next, name="next"),
    path(queue + "items/<int:item_id>/", views.item_page, name="item"),
    path(queue + "items/<int:item_id>/adjudicate/", views.item_adjudicate, name="adjudicate"),
    path(queue + "items/<int:item_id>/canary/", views.item_canary, name="canary"),
]

from django.urls import path

from . import views

app_name = "task_import"

# Under the task template's own registry path, where its page links to them.
definition = "p/<slug:project>/registry/<str:kind>/<slug:slug>/"

urlpatterns = [
    path(definition + "upload/", views.task_upload, name="task_upload"),
    path(definition + "upload/<str:upload>/", views.task_upload_preview, name="task_upload_preview"),
    path(definition + "upload/<str:upload>/progress/", views.task_upload_progress, name="task_upload_progress"),
    path(definition + "upload/<str:upload>/publish/", views.task_upload_publish, name="task_upload_publish"),
]

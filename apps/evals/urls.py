from django.urls import path

from . import views

app_name = "evals"

urlpatterns = [
    path("p/<slug:project>/evals/", views.eval_list, name="list"),
    path("p/<slug:project>/checkpoints/", views.checkpoint_list, name="checkpoints"),
    path("p/<slug:project>/evals/compare/<int:a>/<int:b>/", views.compare_page, name="compare"),
    path("p/<slug:project>/evals/evaluation/<int:pk>/results.jsonl", views.evaluation_results, {"fmt": "jsonl"},
         name="results_jsonl"),
    path("p/<slug:project>/evals/evaluation/<int:pk>/lm-eval.json", views.evaluation_results, {"fmt": "lm-eval"},
         name="results_lm_eval"),
    path("p/<slug:project>/evals/<slug:slug>/", views.suite_page, name="suite_head"),
    path("p/<slug:project>/evals/<slug:slug>/<int:number>/", views.suite_page, name="suite"),
]

from django.apps import AppConfig


class EvalsConfig(AppConfig):
    name = "apps.evals"
    label = "evals"

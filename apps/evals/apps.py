from django.apps import AppConfig


class EvalsConfig(AppConfig):
    name = "apps.evals"
    label = "evals"

    def ready(self) -> None:
        from . import signals  # noqa: F401 -- connects the checkpoint receiver

from django.apps import AppConfig


class RunsConfig(AppConfig):
    name = "apps.runs"
    label = "runs"

    def ready(self):
        # The embedded studio (no Celery broker) trains in the web process itself; see embedded.py.
        from .embedded import start_embedded_training_if_enabled

        start_embedded_training_if_enabled()

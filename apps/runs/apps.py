from django.apps import AppConfig


class RunsConfig(AppConfig):
    name = "apps.runs"
    label = "runs"

    def ready(self):
        # The embedded studio (no Celery broker) runs training in the web process itself; see runner.py.
        from .runner import start_embedded_runner_if_enabled

        start_embedded_runner_if_enabled()

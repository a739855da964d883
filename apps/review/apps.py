from django.apps import AppConfig


class ReviewConfig(AppConfig):
    name = "apps.review"
    label = "review"

    def ready(self) -> None:
        from . import signals  # noqa: F401 -- connects the receiver that makes queues follow runs

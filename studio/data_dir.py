"""The studio's data directory (settings.DATA_DIR: the SQLite database, checkpoints, artifacts, model caches) is
made when manage.py or a Celery worker starts (`migrate` comes first everywhere, the Docker image included),
never by importing the settings; what writes below it makes its own folders."""

from pathlib import Path


def prepare_data_dir() -> None:
    from django.conf import settings

    Path(settings.DATA_DIR).mkdir(parents=True, exist_ok=True)

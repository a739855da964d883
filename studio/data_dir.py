"""The studio's data directory (settings.DATA_DIR: the SQLite database, checkpoints, artifacts, model caches) is
made by the processes that write there — manage.py, the ASGI/WSGI servers, Celery — when they start, never by
importing the settings."""

from pathlib import Path


def prepare_data_dir() -> None:
    from django.conf import settings

    Path(settings.DATA_DIR).mkdir(parents=True, exist_ok=True)

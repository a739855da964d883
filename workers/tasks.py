"""Celery tasks: the only module under workers/ that touches Django. Filled by the engine issues."""

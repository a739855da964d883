"""Helpers for tests that start studio processes of their own (Celery workers, an embedded runserver) on the
test database and watch what they write (tests/e2e; mark them `processes`)."""

import time
from pathlib import Path

from django.db import connection


def database_url() -> str:
    """The test database as a DATABASE_URL for a child process."""
    db = connection.settings_dict
    return f"postgres://{db['USER']}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"


def wait_for(condition, *, seconds: float, what: str, logs: Path):
    """The first truthy value of `condition()`, polled every 50 ms; on timeout, fails with the tails of the
    child processes' logs (`logs`/*.log)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    tails = "\n".join(f"--- {log.name}\n{log.read_text()[-3000:]}" for log in sorted(logs.glob("*.log")))
    raise AssertionError(f"timed out waiting for {what}\n{tails}")

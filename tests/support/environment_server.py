"""A real `manage.py environments serve` process for a test module, on the test process's database: the tests of
the server and those of the trainers' clients start theirs the same way."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
from django.core.management import call_command

from tests.support import ROOT
from tests.support.processes import database_url, wait_for


@contextmanager
def environment_server(*, bundle: str, project: str, data_dir: Path, logs: Path, django_db_blocker,
                       options: tuple[str, ...] = ()) -> Iterator[tuple[str, subprocess.Popen]]:
    """Serves `bundle` of `project` (published and committed by the caller) in a process of its own; yields its base
    URL and the process. On leaving, the server stops and what the module committed is flushed from the test
    database, so that the next tests of this test process find it as pytest-django leaves it."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    environment = {**os.environ, "DATABASE_URL": database_url(), "STUDIO_DATA_DIR": str(data_dir)}
    with (logs / "server.log").open("w") as log:
        process = subprocess.Popen(
            [sys.executable, "manage.py", "environments", "serve", "--bundle", bundle, "--project", project,
             "--port", str(port), *options],
            cwd=ROOT, env=environment, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: _healthy(base, process), seconds=90, what="the environment server", logs=logs)
        yield base, process
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=30)
        with django_db_blocker.unblock():
            call_command("flush", interactive=False, verbosity=0)


def _healthy(base: str, process: subprocess.Popen) -> bool:
    if process.poll() is not None:
        raise AssertionError(f"the environment server exited with {process.returncode}")
    try:
        return httpx.get(f"{base}/health", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False

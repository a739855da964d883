"""Private servers for the fault-injection tests (tests/e2e/test_faults.py; mark them `servers`): a PostgreSQL
cluster and a Redis server of the test's own, on free ports, that it may stop and restart without touching the
services every other test uses, and a small tmpfs to fill."""

from __future__ import annotations

import glob
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def postgres_bin() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    return Path(found[-1]).parent if found else None


def _wait_port(port: int, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise AssertionError(f"nothing listens on port {port} after {seconds} s")


@dataclass
class PrivatePostgres:
    directory: Path
    port: int

    @property
    def url(self) -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/studio"

    def _ctl(self, *args: str) -> None:
        subprocess.run(["runuser", "-u", "postgres", "--", str(postgres_bin() / "pg_ctl"), "-D",
                        str(self.directory / "data"), "-w", "-l", str(self.directory / "server.log"), *args],
                       check=True, capture_output=True)

    def start(self) -> None:
        self._ctl("-o", f"-p {self.port} -k {self.directory} -c listen_addresses=127.0.0.1", "start")

    def stop(self) -> None:
        self._ctl("-m", "fast", "stop")


@contextmanager
def private_postgres():
    """A fresh cluster (trust authentication, user postgres) with an empty database `studio`; removed after."""
    directory = Path(tempfile.mkdtemp(prefix="studio-pg-"))
    shutil.chown(directory, "postgres")
    server = PrivatePostgres(directory, free_port())
    subprocess.run(["runuser", "-u", "postgres", "--", str(postgres_bin() / "initdb"), "-D", str(directory / "data"),
                    "-A", "trust", "-U", "postgres"], check=True, capture_output=True)
    server.start()
    try:
        subprocess.run([str(postgres_bin() / "createdb"), "-h", "127.0.0.1", "-p", str(server.port), "-U", "postgres",
                        "studio"], check=True, capture_output=True)
        yield server
    finally:
        try:
            server.stop()
        finally:
            shutil.rmtree(directory, ignore_errors=True)


@dataclass
class PrivateRedis:
    port: int
    process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.process = subprocess.Popen(["redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
                                         "--save", "", "--appendonly", "no"], stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL)
        _wait_port(self.port, 10)

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=10)


@contextmanager
def private_redis():
    server = PrivateRedis(free_port())
    server.start()
    try:
        yield server
    finally:
        server.kill()


@contextmanager
def small_filesystem(megabytes: int):
    """A tmpfs of `megabytes`, mounted on a fresh directory and unmounted after."""
    mountpoint = Path(tempfile.mkdtemp(prefix="studio-small-"))
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={megabytes}m,mode=0755", "tmpfs", str(mountpoint)],
                   check=True, capture_output=True)
    try:
        yield mountpoint
    finally:
        subprocess.run(["umount", "-l", str(mountpoint)], check=False, capture_output=True)
        os.rmdir(mountpoint)

"""Sandbox tests run real bubblewrap sandboxes; without bubblewrap (or user namespaces) they are skipped."""

import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from workers.sandbox import SandboxImage, SandboxPool
from workers.sandbox.layers import LayerCache
from workers.sandbox.process import UID_BASE, ProcessBackend
from workers.sandbox.types import Limits


def _bubblewrap_works() -> str | None:
    if shutil.which("bwrap") is None:
        return "needs bubblewrap (make setup installs it as root: apt-get install bubblewrap)"
    probe = subprocess.run(["bwrap", "--unshare-all", "--unshare-user", "--ro-bind", "/usr", "/usr", "--symlink",
                            "usr/lib64", "/lib64", "--symlink", "usr/lib", "/lib", "/usr/bin/true"],
                           capture_output=True, text=True)
    return None if probe.returncode == 0 else f"bubblewrap cannot create namespaces here: {probe.stderr.strip()}"


SKIP_REASON = _bubblewrap_works()


def pytest_collection_modifyitems(config, items):
    if SKIP_REASON:
        for item in items:
            if "tests/sandbox" in str(item.fspath):
                item.add_marker(pytest.mark.skip(reason=SKIP_REASON))


TIGHT = Limits(cpu_seconds=2, wall_seconds=3, memory_mb=128, max_processes=32, disk_mb=16, max_file_mb=8,
               open_files=64, output_bytes=4096, output_hard_bytes=1024 * 1024)
HOSTILE_IMAGE = SandboxImage(key="test/hostile@1", layers=({"type": "base", "image": "python-3.11"},),
                             limits=TIGHT, warm_pool_size=2)


def sandbox_processes() -> dict[int, int]:
    """uid -> number of live processes (zombies aside), for every uid the process backend hands out."""
    counts: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                uid = entry.stat().st_uid
                state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            except (FileNotFoundError, ProcessLookupError):
                continue
            if uid >= UID_BASE and state != "Z":
                counts[uid] = counts.get(uid, 0) + 1
    return counts


@pytest.fixture
def cache_root():
    """A fresh layer-cache directory that the sandbox uids can reach (pytest's tmp_path is private to root)."""
    root = Path(tempfile.mkdtemp(prefix="studio-layers-", dir="/var/tmp"))
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def layer_cache():
    root = Path(tempfile.mkdtemp(prefix="studio-layers-", dir="/var/tmp"))
    yield LayerCache(root)
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def pool(layer_cache):
    pool = SandboxPool(ProcessBackend(layers=layer_cache), heartbeat_interval=1.0)
    pool.warm(HOSTILE_IMAGE)
    yield pool
    pool.close()


def settle(pool, image=HOSTILE_IMAGE, timeout=10.0):
    """Wait until the pool is back at its warm size with nothing busy, starting or resetting."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = next(s for s in pool.status() if s["image"] == image.key)
        if state["busy"] == state["starting"] == state["resetting"] == state["destroying"] == 0 \
                and state["warm"] >= state["target"]:
            return state
        time.sleep(0.02)
    raise AssertionError(f"pool did not settle: {pool.status()}")

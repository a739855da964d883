"""Helpers for the tests that run real sandboxes (mark them `sandbox`; the docker backend's, `docker`)."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

from tests.support.resources import require
from workers.sandbox import SandboxImage, SandboxPool
from workers.sandbox.layers import LayerCache
from workers.sandbox.process import ProcessBackend, own_uid_range
from workers.sandbox.soak import uid_process_counts
from workers.sandbox.types import Limits

TIGHT = Limits(cpu_seconds=2, wall_seconds=3, memory_mb=128, max_processes=32, disk_mb=16, max_file_mb=8,
               open_files=64, output_bytes=4096, output_hard_bytes=1024 * 1024)
HOSTILE_IMAGE = SandboxImage(key="test/hostile@1", layers=({"type": "base", "image": "python-3.11"},),
                             limits=TIGHT, warm_pool_size=2)
# Processes in one idle sandbox: bwrap outside, bwrap's init, the zygote and its spare child inside; docker's
# init, the zygote and its spare.
IDLE_PROCESSES = {"process": 4, "docker": 3}


def reachable_cache() -> LayerCache:
    """A layer cache the sandbox uids can reach (pytest's tmp_path is private to root)."""
    return LayerCache(Path(tempfile.mkdtemp(prefix="studio-layers-", dir="/var/tmp")))


def remove_cache(cache: LayerCache) -> None:
    shutil.rmtree(cache.root, ignore_errors=True)


@contextmanager
def process_pool(*images: SandboxImage, **options):
    """A bubblewrap SandboxPool over a layer cache of its own, warm for `images`; closed (and its cache removed)
    on leaving. For fixtures: it requires the `sandbox` resource itself."""
    require("sandbox")
    cache = reachable_cache()
    pool = SandboxPool(ProcessBackend(layers=cache), **options)
    try:
        for image in images:
            pool.warm(image)
        yield pool
    finally:
        pool.close()
        remove_cache(cache)


def sandbox_processes() -> dict[int, int]:
    """uid -> live processes, for the uids this test process hands to sandboxes (other processes' sandboxes,
    a soak run say, are not ours to count)."""
    return uid_process_counts(own_uid_range())


def sandbox_process_counts(pool) -> dict:
    """sandbox -> its live processes, for the sandboxes this test process started on the pool's backend."""
    if pool.backend.name == "docker":
        from workers.sandbox.docker import LABEL

        containers = pool.backend.client.containers.list(all=True, filters={"label": f"{LABEL}={os.getpid()}"})
        return {c.id: len(c.top()["Processes"] or []) if c.status == "running" else 0 for c in containers}
    return sandbox_processes()


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

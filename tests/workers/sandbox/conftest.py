"""Sandbox tests run real bubblewrap sandboxes; without bubblewrap (or user namespaces) they are skipped."""

import os
import time

import pytest
from sandbox_support import reachable_cache, remove_cache, skip_without_bubblewrap

from workers.sandbox import SandboxImage, SandboxPool
from workers.sandbox.process import ProcessBackend, own_uid_range
from workers.sandbox.soak import uid_process_counts
from workers.sandbox.types import Limits


def pytest_collection_modifyitems(config, items):
    skip_without_bubblewrap(items, "tests/sandbox")


TIGHT = Limits(cpu_seconds=2, wall_seconds=3, memory_mb=128, max_processes=32, disk_mb=16, max_file_mb=8,
               open_files=64, output_bytes=4096, output_hard_bytes=1024 * 1024)
HOSTILE_IMAGE = SandboxImage(key="test/hostile@1", layers=({"type": "base", "image": "python-3.11"},),
                             limits=TIGHT, warm_pool_size=2)


def sandbox_processes() -> dict[int, int]:
    """uid -> live processes, for the uids this test process hands to sandboxes (other processes' sandboxes,
    a soak run say, are not ours to count)."""
    return uid_process_counts(own_uid_range())


@pytest.fixture
def cache_root():
    """A fresh layer-cache directory that the sandbox uids can reach."""
    cache = reachable_cache()
    yield cache.root
    remove_cache(cache)


@pytest.fixture(scope="session")
def layer_cache():
    cache = reachable_cache()
    yield cache
    remove_cache(cache)


def docker_skip_reason() -> str | None:
    try:
        import docker

        docker.from_env().ping()
    except Exception as exc:
        return f"needs a Docker engine (DOCKER_HOST; .ci/run starts one): {type(exc).__name__}"
    return None


def make_backend(name: str, layer_cache):
    if name == "docker":
        reason = docker_skip_reason()
        if reason:
            pytest.skip(reason)
        from workers.sandbox.docker import DockerBackend

        return DockerBackend()
    return ProcessBackend(layers=layer_cache)


@pytest.fixture(scope="module", params=["process", "docker"])
def pool(request, layer_cache):
    pool = SandboxPool(make_backend(request.param, layer_cache), heartbeat_interval=1.0)
    pool.warm(HOSTILE_IMAGE)
    yield pool
    pool.close()
    assert sandbox_process_counts(pool) == {}, "processes outlived the pool"


def sandbox_process_counts(pool) -> dict:
    """sandbox -> its live processes, for the sandboxes this test process started on the pool's backend."""
    if pool.backend.name == "docker":
        from workers.sandbox.docker import LABEL

        containers = pool.backend.client.containers.list(all=True, filters={"label": f"{LABEL}={os.getpid()}"})
        return {c.id: len(c.top()["Processes"] or []) if c.status == "running" else 0 for c in containers}
    return sandbox_processes()


# Processes in one idle sandbox: bwrap outside, bwrap's init, the zygote and its spare child inside; docker's
# init, the zygote and its spare.
IDLE_PROCESSES = {"process": 4, "docker": 3}


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

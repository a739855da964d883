"""A module's sandbox pool on each backend: bubblewrap (tests marked `sandbox` through the parameter) and Docker
(`docker`). The helpers the tests share are in tests/support/sandbox.py."""

import pytest

from tests.support.resources import require
from tests.support.sandbox import HOSTILE_IMAGE, reachable_cache, remove_cache, sandbox_process_counts
from workers.sandbox import SandboxPool
from workers.sandbox.process import ProcessBackend


@pytest.fixture
def cache_root():
    """A fresh layer-cache directory that the sandbox uids can reach."""
    cache = reachable_cache()
    yield cache.root
    remove_cache(cache)


def make_backend(name: str, layer_cache):
    require({"process": "sandbox", "docker": "docker"}[name])
    if name == "docker":
        from workers.sandbox.docker import DockerBackend

        return DockerBackend()
    return ProcessBackend(layers=layer_cache)


@pytest.fixture(scope="module", params=[pytest.param("process", marks=pytest.mark.sandbox),
                                        pytest.param("docker", marks=pytest.mark.docker)])
def pool(request, layer_cache):
    pool = SandboxPool(make_backend(request.param, layer_cache), heartbeat_interval=1.0)
    # Sandboxes this test process already holds in other pools (a session-wide warm pool of a test that ran before
    # in the same pytest-xdist worker) are not this pool's to give back.
    others = set(sandbox_process_counts(pool))
    pool.warm(HOSTILE_IMAGE)
    yield pool
    pool.close()
    outlived = {sandbox: n for sandbox, n in sandbox_process_counts(pool).items() if sandbox not in others}
    assert outlived == {}, "processes outlived the pool"

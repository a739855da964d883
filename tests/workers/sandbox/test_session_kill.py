"""A worker killed outright (SIGKILL, no chance to clean up) in the middle of a session's call leaves nothing behind:
no process of its sandboxes, no mount, no workspace, no container or control directory; what it could not remove
itself (its cgroups) the next backend reaps."""

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.support.resources import require
from tests.support.sandbox import reachable_cache, remove_cache
from workers.sandbox.docker import LABEL
from workers.sandbox.soak import _temporary_entries, uid_process_counts

ROOT = Path(__file__).resolve().parents[3]

HOLDER = textwrap.dedent("""
    import sys, threading
    from pathlib import Path
    from workers.sandbox import SandboxImage, SandboxPool
    from workers.sandbox.backends import backend_named
    from workers.definitions.specs import SessionSettings
    from workers.sandbox.session import WorkspaceSource

    backend = backend_named(sys.argv[1], layer_cache=Path(sys.argv[2]))
    pool = SandboxPool(backend)
    image = SandboxImage(key="test/killed@1", layers=({"type": "base", "image": "python-3.11"},), warm_pool_size=1)
    session = pool.open_session(image, SessionSettings(call_seconds=60, disk_mb=32, memory_mb=128),
                                workspace=WorkspaceSource.directory(sys.argv[3]), timeout=120)
    session.exec("echo work > in-progress.txt")
    threading.Thread(target=session.exec, args=("sleep 60",), daemon=True).start()
    print("holding", session.id, flush=True)
    threading.Event().wait()
""")


def _mounts() -> set[str]:
    return {line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()}


@pytest.mark.parametrize("backend", [pytest.param("process", marks=pytest.mark.sandbox),
                                     pytest.param("docker", marks=pytest.mark.docker)])
def test_a_worker_killed_mid_session_leaves_no_process_mount_or_workspace(backend, tmp_path):
    require({"process": "sandbox", "docker": "docker"}[backend])
    cache = reachable_cache()
    (tmp_path / "repo").mkdir()
    (tmp_path / "repo" / "main.py").write_text("print('hi')\n")
    from workers.sandbox.backends import backend_named

    probe = backend_named(backend, layer_cache=cache.root)
    temporary_before, mounts_before = _temporary_entries(probe), _mounts()
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, backend, str(cache.root), str(tmp_path / "repo")],
                              cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = holder.stdout.readline()
        assert line.startswith("holding"), holder.stderr.read() if holder.poll() is not None else line
        time.sleep(0.3)  # the call is running in the sandbox
        uids = range(200_000 + (holder.pid % 1000) * 1000, 200_000 + (holder.pid % 1000) * 1000 + 1000)
        if backend == "process":
            assert uid_process_counts(uids), "the session's sandbox was not running"
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=10)

        def leftovers() -> list[str]:
            found = []
            if backend == "process":
                found += [f"process of uid {uid}" for uid in uid_process_counts(uids)]
            else:
                # Every container of the killed worker (its warm pool's too) and its control directory: a warm
                # container still removing itself keeps its directory until the next reaping.
                found += [f"container {c['Names']}" for c in probe.client.api.containers(
                    all=True, filters={"label": f"{LABEL}={holder.pid}"})]
                found += [f"control directory {entry}" for entry in _temporary_entries(probe) - temporary_before]
            found += [f"mount {m}" for m in _mounts() - mounts_before]
            return found

        # A loaded machine (CI's parallel test processes) starts and removes containers slowly: one the killed
        # worker was still starting may appear after the first reaping, and leaves by itself within 60 s.
        deadline = time.monotonic() + 90
        while leftovers() and time.monotonic() < deadline:
            if backend == "docker":
                # A container the killed worker was still starting waits for its host to connect (60 s at most);
                # the next backend to start on the machine removes it at once.
                probe.reap_orphans(older_than=0)
            time.sleep(0.1)
        assert leftovers() == []
        # The workspace lived in the sandbox's own tmpfs: nothing of it on the host but the cached preparation.
        if backend == "process":
            from workers.sandbox.cgroups import GROUP, reap_orphans
            from workers.sandbox.cgroups import ROOT as CGROUPS

            reap_orphans()
            owned = [p for c in ("memory", "pids", "cpu") if (CGROUPS / c / GROUP).is_dir()
                     for p in (CGROUPS / c / GROUP).iterdir() if p.name.startswith(f"{holder.pid}-")]
            assert owned == []
        assert _temporary_entries(probe) - temporary_before == set()
    finally:
        if holder.poll() is None:
            os.kill(holder.pid, signal.SIGKILL)
        remove_cache(cache)

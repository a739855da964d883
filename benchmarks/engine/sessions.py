"""`manage.py bench sessions`: what a sandbox session costs against a one-shot call, on one backend.

- session_start: opening a session while a sandbox of its prepared workspace is warm (the workspace copied in the
  background), and cold (a new sandbox started and the workspace copied, as when no warm one is left);
- session_call: one command in a held session; one_shot_call: the same command in a warm sandbox of the plain
  image, leased and given back (acquire, run, release: what a stateless tool call costs);
- held: how many sessions were opened at once and held, and the memory each takes (its cgroup's, which counts its
  processes and its workspace's tmpfs pages; and the host's MemAvailable drop per session).
Targets: a session starts within 3x a warm one-shot call, and a call in a session is no slower than a one-shot call.
The workspace is a generated repository (`--workspace-files` files of 2 KB), prepared once before measuring.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

from workers.definitions.specs import SessionSettings
from workers.sandbox.interface import SandboxBackend
from workers.sandbox.pool import SandboxPool, latency_summary
from workers.sandbox.session import WorkspaceSource, prepared_image
from workers.sandbox.types import Execution, SandboxImage

IMAGE = SandboxImage(key="bench/session-python@1", layers=({"type": "base", "image": "python-3.11"},),
                     warm_pool_size=2)
SPEC = SessionSettings(idle_timeout=120, lifetime=600, max_calls=100_000, disk_mb=128, memory_mb=256, call_seconds=30)
COMMAND = ["python3", "-c", "print(sum(range(100)))"]


def _repository(root: Path, files: int) -> WorkspaceSource:
    for index in range(files):
        path = root / f"package_{index % 20}" / f"module_{index}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(f"def function_{n}(value):\n    return value + {n}\n\n" for n in range(60))[:2048])
    return WorkspaceSource.directory(root)


def _mem_available_mb() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _cgroup_memory_mb(sandbox) -> float | None:
    """The sandbox's memory as its cgroup counts it (processes and tmpfs pages), where it can be read."""
    group = getattr(getattr(sandbox, "cgroup", None), "memory", None)
    if group is None and getattr(sandbox, "container", None) is not None:
        from workers.sandbox.docker import CGROUP_MEMORY

        group = CGROUP_MEMORY / sandbox.container.id
    try:
        return int((group / "memory.usage_in_bytes").read_text()) / 2**20
    except (OSError, TypeError, ValueError):
        return None


def _settle(pool: SandboxPool, image: SandboxImage, timeout: float = 60.0) -> None:
    """Wait until the image's warm sandboxes are all back (so each timing measures a warm acquire)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = next((s for s in pool.status() if s["image"] == image.key), None)
        if state and state["warm"] >= image.warm_pool_size and not state["resetting"] and not state["starting"]:
            return
        time.sleep(0.005)


def run(*, backend: SandboxBackend, samples: int = 100, held_sessions: int = 16, workspace_files: int = 200,
        **_) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench-sessions-") as folder:
        workspace = _repository(Path(folder), workspace_files)
        prepared = prepared_image(IMAGE, SPEC, workspace)
        pool = SandboxPool(backend, session_ceiling=max(16, held_sessions + 2), lease_idle_timeout=600)
        try:
            pool.open_session(IMAGE, SPEC, workspace=workspace, timeout=600).close()  # prepares it, once
            pool.warm(IMAGE)
            _settle(pool, IMAGE)
            _settle(pool, prepared)

            one_shot = []
            for _ in range(samples):
                started = time.perf_counter()
                with pool.acquire(IMAGE) as lease:
                    result = lease.run(Execution(command=COMMAND))
                one_shot.append(time.perf_counter() - started)
                assert result.stdout == b"4950\n", result
                _settle(pool, IMAGE)

            starts, calls = [], []
            for index in range(max(10, samples // 5)):
                started = time.perf_counter()
                session = pool.open_session(IMAGE, SPEC, workspace=workspace, timeout=60)
                starts.append(time.perf_counter() - started)
                with session:
                    for _ in range(samples if index == 0 else 5):
                        started = time.perf_counter()
                        result = session.exec(COMMAND)
                        calls.append(time.perf_counter() - started)
                        assert result.stdout == b"4950\n", result
                _settle(pool, prepared)

            cold = []
            for _ in range(max(5, samples // 20)):
                started = time.perf_counter()
                sandbox = backend.start(prepared)
                cold.append(time.perf_counter() - started)
                sandbox.destroy()

            available_before = _mem_available_mb()
            held = [pool.open_session(IMAGE, SPEC, workspace=workspace, timeout=120) for _ in range(held_sessions)]
            for session in held:
                session.exec("echo held > held.txt")
            alive = sum(session.alive for session in held)
            per_session = sorted(m for m in (_cgroup_memory_mb(s._lease.sandbox) for s in held) if m is not None)
            host_drop = max(0.0, available_before - _mem_available_mb()) / max(1, held_sessions)
            for session in held:
                session.close()
        finally:
            pool.close()

    start, call, shot = latency_summary(starts), latency_summary(calls), latency_summary(one_shot)
    memory_each = per_session[len(per_session) // 2] if per_session else None
    return {
        "backend": backend.name, "command": COMMAND, "workspace_files": workspace_files,
        "session_start_p50_ms": start["p50_ms"], "session_start_p95_ms": start["p95_ms"],
        "session_start_cold_p50_ms": latency_summary(cold)["p50_ms"],
        "session_call_p50_ms": call["p50_ms"], "session_call_p95_ms": call["p95_ms"],
        "one_shot_call_p50_ms": shot["p50_ms"], "one_shot_call_p95_ms": shot["p95_ms"],
        "concurrent_sessions_held": alive, "sessions_opened": held_sessions,
        "memory_per_session_mb": round(memory_each, 1) if memory_each is not None else None,
        "host_memory_per_session_mb": round(host_drop, 1),
        "sessions_this_machine_holds_estimate": int(available_before / max(memory_each or host_drop, 1)),
        "targets": {"start_within_3x_one_shot": start["p50_ms"] <= 3 * shot["p50_ms"],
                    "call_no_slower_than_one_shot": call["p50_ms"] <= shot["p50_ms"]},
        "load_average": list(os.getloadavg()),
    }

"""SandboxPool: warm sandboxes per image version, handed out one trajectory at a time.

- `acquire(image, timeout=)` leases a warm sandbox (or waits for one, starting more up to the image's ceiling);
  the lease is a context manager, and a trajectory may run several programs in it (a multi-step session).
- On release the sandbox is reset to its image's clean state in the background before anyone else gets it,
  or destroyed if it cannot be; dead sandboxes are replaced so the pool stays at its warm size. A lease taken from
  the warm ones starts another at once (the warm size is what is kept idle), so the pool grows with the leases
  out, up to the image's ceiling; what it grew by is kept while the image is in use and let go once nobody has
  acquired one for `surplus_seconds`. (Destroying each released sandbox beyond the warm size made every lease
  cost a sandbox start: 37 a step in `bench pipeline`.)
- A maintenance thread pings idle sandboxes (heartbeat) and reclaims leases that stopped answering: a session
  idle past `lease_idle_timeout` loses its sandbox.
- `open_session(image, spec, workspace=)` leases a sandbox of the image's *prepared workspace* (session.py) for one
  trajectory: its own idle timeout and hard lifetime, reclaimed by the maintenance thread past either or when its
  sandbox dies. The warm sandboxes of a prepared workspace that nobody opened for `session_warm_seconds` are let go.
- `execute(image, execution)` is acquire + run + release, retrying infrastructure errors a bounded number of
  times; a program's own failure (error, timeout, killed) is never retried.
- Once its background threads can no longer take work (the interpreter is exiting: concurrent.futures refuses new
  jobs), the pool starts nothing more, destroys on the caller's thread what it would have reset or destroyed in
  the background, and its maintenance thread carries on: a process that stops mid-run releases its sandboxes.
"""

from __future__ import annotations

import json
import logging
import os
import statistics
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from .interface import SandboxBackend
from .session import Session, prepared_image
from .types import Execution, ExecutionResult, LeaseExpired, SandboxImage, Status

log = logging.getLogger(__name__)


class AcquireTimeout(Exception):
    """No sandbox became free before the deadline."""


class ImageUnavailable(Exception):
    """Sandboxes of this image keep failing to start; the reason is the last start error."""


def latency_summary(seconds) -> dict:
    """p50 and p95 in milliseconds of durations in seconds (the pool's timings and the benchmarks')."""
    data = sorted(seconds)
    if not data:
        return {"p50_ms": None, "p95_ms": None, "count": 0}
    return {"p50_ms": round(statistics.median(data) * 1000, 2),
            "p95_ms": round(data[min(len(data) - 1, int(0.95 * len(data)))] * 1000, 2), "count": len(data)}


@dataclass
class _ImagePool:
    image: SandboxImage
    target: int
    ceiling: int
    sessions: bool = False  # a prepared workspace's sandboxes (session.prepared_image): its warm ones are let go
    last_acquired: float = field(default_factory=time.monotonic)
    idle: deque = field(default_factory=deque)
    busy: set = field(default_factory=set)
    starting: int = 0
    resetting: int = 0
    waiting: int = 0
    failed_starts: int = 0
    consecutive_failures: int = 0
    last_error: str = ""
    assembly: deque = field(default_factory=lambda: deque(maxlen=1000))
    waits: deque = field(default_factory=lambda: deque(maxlen=1000))

    @property
    def total(self) -> int:
        return len(self.idle) + len(self.busy) + self.starting + self.resetting


class Lease:
    """A sandbox held by one trajectory. Use as a context manager; `run` as often as the session needs."""

    def __init__(self, pool: SandboxPool, entry: _ImagePool, sandbox):
        self._pool, self._entry, self.sandbox = pool, entry, sandbox
        self.last_active = time.monotonic()
        self.expired = False
        self.expired_reason = ""
        self.running = False
        self.idle_timeout: float | None = None  # a session's own; None: the pool's lease_idle_timeout
        self.deadline: float | None = None  # a session's hard end (time.monotonic()); reclaimed once past it

    def run(self, execution: Execution) -> ExecutionResult:
        return self._use(self.sandbox.run, execution)

    def call(self, message: dict) -> dict:
        """A session's read, write or diff (Sandbox.call)."""
        return self._use(self.sandbox.call, message)

    def _use(self, method, argument):
        if self.expired:
            raise LeaseExpired(self.expired_reason or "this sandbox was reclaimed after the session stopped "
                                                      "answering")
        self.running = True
        try:
            return method(argument)
        finally:
            self.running = False
            self.last_active = time.monotonic()

    def release(self) -> None:
        self._pool._release(self._entry, self)

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, *exc) -> None:
        self.release()


class SandboxPool:
    def __init__(self, backend: SandboxBackend, *, ceiling_factor: int = 2, lease_idle_timeout: float = 300.0,
                 heartbeat_interval: float = 5.0, max_start_failures: int = 3, workers: int = 4,
                 status_dir: Path | None = None, session_ceiling: int = 16, session_warm_seconds: float = 120.0,
                 surplus_seconds: float = 30.0):
        """status_dir: where the pool publishes its status every second (for `manage.py sandbox pool-status`,
        which runs in another process). session_ceiling: sandboxes of one prepared workspace held or starting at
        once (a group's samples each hold one for their whole trajectory); session_warm_seconds: how long the
        warm sandboxes of a prepared workspace nobody opened are kept; surplus_seconds: how long idle sandboxes
        beyond an image's warm size are kept after its last acquire."""
        self.backend = backend
        self.session_ceiling = session_ceiling
        self.session_warm_seconds = session_warm_seconds
        self.surplus_seconds = surplus_seconds
        self._status_file = status_dir / f"pool-{os.getpid()}-{id(self):x}.json" if status_dir else None
        self.ceiling_factor = ceiling_factor
        self.lease_idle_timeout = lease_idle_timeout
        self.heartbeat_interval = heartbeat_interval
        self.max_start_failures = max_start_failures
        self._images: dict[str, _ImagePool] = {}
        self._leases: set[Lease] = set()
        self._destroying = 0
        self._lock = threading.Condition()
        self._jobs = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="sandbox-pool")
        self._closed = False
        self._refused = False  # the background threads took no more work: see _submit
        self._maintenance = threading.Thread(target=self._maintain, name="sandbox-pool-maintenance", daemon=True)
        self._maintenance.start()

    # --- public -------------------------------------------------------------------------------------------

    def warm(self, image: SandboxImage, size: int | None = None) -> None:
        """Keep `size` (default: the image's warm_pool_size) sandboxes of this image ready."""
        with self._lock:
            entry = self._entry(image)
            entry.target = image.warm_pool_size if size is None else size
            entry.ceiling = max(entry.ceiling, entry.target * self.ceiling_factor, 1)
            self._fill(entry)

    def acquire(self, image: SandboxImage, *, timeout: float = 30.0) -> Lease:
        started = time.monotonic()
        deadline = started + timeout
        with self._lock:
            entry = self._entry(image)
            while True:
                if self._closed:
                    raise AcquireTimeout("the pool is closed")
                entry.last_acquired = time.monotonic()
                while entry.idle:
                    sandbox = entry.idle.popleft()
                    if sandbox.alive:
                        lease = Lease(self, entry, sandbox)
                        entry.busy.add(sandbox)
                        self._leases.add(lease)
                        entry.waits.append(time.monotonic() - started)
                        self._fill(entry)
                        return lease
                    self._discard(sandbox)
                if entry.consecutive_failures >= self.max_start_failures:
                    raise ImageUnavailable(f"{image.key}: {entry.last_error}")
                # One sandbox on its way (starting or being reset) for each waiting caller, up to the ceiling.
                if entry.total < entry.ceiling and entry.starting + entry.resetting <= entry.waiting \
                        and self._may_start(entry):
                    self._start(entry)
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise AcquireTimeout(f"no sandbox of {image.key} became free within {timeout:g} s "
                                         f"({len(entry.busy)} busy, {entry.starting} starting)")
                entry.waiting += 1
                try:
                    self._lock.wait(remaining)
                finally:
                    entry.waiting -= 1

    def open_session(self, image: SandboxImage, spec, *, workspace=None, timeout: float = 60.0):
        """A Session (session.py) of `image` with the workspace `workspace` (a WorkspaceSource, or None: the
        image's files) prepared by `spec.prepare`: a warm sandbox of that prepared workspace, leased until the
        session closes. Raises AcquireTimeout / ImageUnavailable as acquire does (an infrastructure error of the
        trajectory); the first session of a prepared workspace waits for its preparation."""
        started = time.monotonic()
        lease = self.acquire(prepared_image(image, spec, workspace), timeout=timeout)
        return Session(lease, spec, open_seconds=time.monotonic() - started)

    def execute(self, image: SandboxImage, execution: Execution, *, timeout: float = 30.0,
                retries: int = 2, on_acquired=None) -> ExecutionResult:
        """One program in a fresh lease. Infrastructure errors are retried up to `retries` times.

        on_acquired: called once a sandbox is leased and the program is about to run (a caller that tells
        waiting for a sandbox from running in it, as the RL pipeline's idle accounting does)."""
        reason = ""
        for attempt in range(1, retries + 2):
            try:
                with self.acquire(image, timeout=timeout) as lease:
                    if on_acquired is not None:
                        on_acquired()
                    result = lease.run(execution)
            except (AcquireTimeout, ImageUnavailable, LeaseExpired) as exc:
                reason = str(exc)
                if isinstance(exc, ImageUnavailable):
                    break
                continue
            except Exception as exc:  # the sandbox machinery failed, not the program
                reason = f"{type(exc).__name__}: {exc}"
                continue
            result.attempts = attempt
            if result.status != Status.INFRA_ERROR:
                return result
            reason = result.reason
        return ExecutionResult(status=Status.INFRA_ERROR, reason=reason, attempts=attempt,
                               backend=self.backend.name)

    def status(self) -> list[dict]:
        with self._lock:
            return [{
                "image": key, "warm": len(entry.idle), "busy": len(entry.busy), "starting": entry.starting,
                "resetting": entry.resetting, "failed_starts": entry.failed_starts, "target": entry.target,
                "ceiling": entry.ceiling, "last_error": entry.last_error, "destroying": self._destroying,
                "environment_assembly": latency_summary(entry.assembly),
                "wait_for_sandbox": latency_summary(entry.waits),
            } for key, entry in sorted(self._images.items())]

    def close(self) -> None:
        with self._lock:
            self._closed = True
            sandboxes = [s for e in self._images.values() for s in (*e.idle, *e.busy)]
            for entry in self._images.values():
                entry.idle.clear()
                entry.busy.clear()
            self._lock.notify_all()
        self._maintenance.join(timeout=5)
        # Jobs still running (starts, resets, heartbeats) see _closed and destroy what they hold.
        self._jobs.shutdown(wait=True)
        for sandbox in sandboxes:
            sandbox.destroy()
        if self._status_file is not None:
            self._status_file.unlink(missing_ok=True)

    # --- internals (call with the lock held unless said otherwise) ---------------------------------------

    def _discard(self, sandbox) -> None:
        """Destroy a sandbox off the caller's path; once the pool is closing, right here."""
        if self._closed:
            sandbox.destroy()
            return
        self._destroying += 1
        if not self._submit(self._destroy_job, sandbox):
            self._destroying -= 1
            sandbox.destroy()

    def _destroy_job(self, sandbox) -> None:  # in a worker thread, without the lock
        try:
            sandbox.destroy()
        finally:
            with self._lock:
                self._destroying -= 1

    def _entry(self, image: SandboxImage) -> _ImagePool:
        entry = self._images.get(image.key)
        if entry is None:
            target = image.warm_pool_size
            sessions = bool(image.layers) and image.layers[-1]["type"] == "workspace"
            ceiling = max(target * self.ceiling_factor, self.session_ceiling if sessions else 1)
            entry = _ImagePool(image=image, target=target, ceiling=ceiling, sessions=sessions)
            self._images[image.key] = entry
        return entry

    def _may_start(self, entry: _ImagePool) -> bool:
        """Whether another start may be tried. After a failure, the starts in flight count against the image's
        remaining tries, so an image that cannot start fails max_start_failures times, not once per caller or
        refill that happened to be waiting."""
        if entry.consecutive_failures == 0:
            return True
        return entry.consecutive_failures + entry.starting < self.max_start_failures

    def _fill(self, entry: _ImagePool) -> None:
        while not self._closed and len(entry.idle) + entry.starting + entry.resetting < entry.target \
                and entry.total < entry.ceiling and self._may_start(entry):
            self._start(entry)

    def _start(self, entry: _ImagePool) -> None:
        entry.starting += 1
        if not self._submit(self._start_job, entry):
            entry.starting -= 1
            entry.last_error = "the process is exiting: no sandbox is started any more"

    def _submit(self, job, *args) -> bool:
        """Hand `job` to the background threads; False when they take no more work (the interpreter is exiting,
        or the pool closed them): the caller then does without, or does it itself. With the lock held."""
        if self._refused:
            return False
        try:
            self._jobs.submit(job, *args)
        except RuntimeError:  # "cannot schedule new futures after (interpreter) shutdown"
            self._refused = True
            log.info("sandbox pool: the process is exiting; no sandbox is started or reset any more")
            return False
        return True

    def _start_job(self, entry: _ImagePool) -> None:  # in a worker thread, without the lock
        started = time.monotonic()
        try:
            sandbox = self.backend.start(entry.image)
        except Exception as exc:
            with self._lock:
                entry.starting -= 1
                entry.failed_starts += 1
                entry.consecutive_failures += 1
                entry.last_error = f"{type(exc).__name__}: {exc}"
                self._lock.notify_all()
            return
        with self._lock:
            entry.starting -= 1
            entry.consecutive_failures = 0
            entry.assembly.append(time.monotonic() - started)
            if self._closed:
                self._discard(sandbox)
                return
            entry.idle.append(sandbox)
            self._lock.notify_all()

    def _release(self, entry: _ImagePool, lease: Lease) -> None:
        with self._lock:
            if lease not in self._leases:
                return  # released twice, or reclaimed already
            self._leases.discard(lease)
            entry.busy.discard(lease.sandbox)
            lease.expired = True
            if self._closed:
                self._discard(lease.sandbox)
                return
            if self._submit(self._reset_job, entry, lease.sandbox):
                entry.resetting += 1
            else:
                lease.sandbox.destroy()

    def _reset_job(self, entry: _ImagePool, sandbox) -> None:  # in a worker thread, without the lock
        healthy = sandbox.alive
        if healthy:
            try:
                sandbox.reset()
            except Exception:
                healthy = False
        if not healthy:
            sandbox.destroy()  # still counted as resetting until here
        with self._lock:
            entry.resetting -= 1
            if healthy and not self._closed and (len(entry.idle) < entry.target or entry.waiting
                                                 or self._surplus_kept(entry)):
                entry.idle.append(sandbox)
            elif healthy:
                self._discard(sandbox)
            self._fill(entry)
            self._lock.notify_all()

    def _publish_status(self) -> None:
        if self._status_file is None:
            return
        try:
            self._status_file.parent.mkdir(parents=True, exist_ok=True)
            temporary = self._status_file.with_suffix(".tmp")
            temporary.write_text(json.dumps({"pid": os.getpid(), "backend": self.backend.name,
                                             "updated": time.time(), "images": self.status()}))
            temporary.replace(self._status_file)
        except OSError:  # a status nobody can read must not stop the maintenance thread
            log.warning("sandbox pool: could not publish its status to %s", self._status_file, exc_info=True)

    def _maintain(self) -> None:
        last_ping = last_publish = time.monotonic()
        self._publish_status()
        while True:
            if time.monotonic() - last_publish >= 1.0:
                self._publish_status()
                last_publish = time.monotonic()
            with self._lock:
                if self._closed:
                    return
                self._lock.wait(0.2)
                if self._closed:
                    return
                now = time.monotonic()
                for lease in list(self._leases):
                    reason = self._reclaim_reason(lease, now)
                    if reason:
                        self._leases.discard(lease)
                        lease.expired, lease.expired_reason = True, reason
                        lease._entry.busy.discard(lease.sandbox)
                        self._discard(lease.sandbox)
                for entry in self._images.values():
                    while len(entry.idle) > entry.target and not self._surplus_kept(entry):
                        self._discard(entry.idle.popleft())  # what the image grew by, no longer in use
                    if entry.sessions and entry.target and not entry.busy \
                            and now - entry.last_acquired > self.session_warm_seconds:
                        entry.target = 0  # a prepared workspace nobody opens any more: its warm copies go
                        while entry.idle:
                            self._discard(entry.idle.popleft())
                ping = now - last_ping >= self.heartbeat_interval
                idle = [(entry, sandbox) for entry in self._images.values() for sandbox in entry.idle] if ping else []
                for entry in self._images.values():
                    self._fill(entry)
            if ping:
                last_ping = time.monotonic()
                with self._lock:
                    for entry, sandbox in idle:
                        if not self._submit(self._heartbeat_job, entry, sandbox):
                            break  # not pinged: an idle sandbox is destroyed by close() all the same

    def _surplus_kept(self, entry: _ImagePool) -> bool:
        """Whether idle sandboxes beyond the image's warm size are still kept (with the lock held). A prepared
        workspace's are not: session_warm_seconds lets them go."""
        return not entry.sessions and time.monotonic() - entry.last_acquired < self.surplus_seconds

    def _reclaim_reason(self, lease: Lease, now: float) -> str:
        """Why a lease is taken back now ("" to keep it): idle past its timeout, past a session's hard lifetime, or
        its sandbox died between calls (a held session's heartbeat: a local liveness check, no round trip). A
        lease in the middle of a call is left to the call, whose own limits end it."""
        if lease.running:
            return ""
        idle_timeout = self.lease_idle_timeout if lease.idle_timeout is None else lease.idle_timeout
        if now - lease.last_active > idle_timeout:
            return f"reclaimed after {idle_timeout:g} s without a call"
        if lease.deadline is not None and now > lease.deadline:
            return "reclaimed at the end of the session's lifetime"
        if not lease.sandbox.alive:
            return "the session's sandbox died between calls"
        return ""

    def _heartbeat_job(self, entry: _ImagePool, sandbox) -> None:
        with self._lock:
            if sandbox not in entry.idle:
                return  # handed out meanwhile
            entry.idle.remove(sandbox)
            entry.resetting += 1  # out of circulation while it is being checked
        answered = sandbox.alive and sandbox.ping()
        if not answered:
            sandbox.destroy()  # still counted as resetting until here
        with self._lock:
            entry.resetting -= 1
            if answered and self._closed:
                self._discard(sandbox)
            elif answered:
                entry.idle.append(sandbox)
            self._fill(entry)
            self._lock.notify_all()

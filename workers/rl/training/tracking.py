"""Where the pipeline reports: a Tracker (protocols.py) receives each step's points, trajectories and events, the
checkpoints and the heartbeats. The studio's tracker writes through apps.runs.services (apps/runs/attempts/); the
MemoryTracker keeps everything in lists for tests, benchmarks and notebooks. The Heartbeat keeps the run's lease
while the pipeline runs, and only while it makes progress."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ..protocols import LeaseLost, Tracker

log = logging.getLogger(__name__)

@dataclass
class MemoryTracker:
    steps: list = field(default_factory=list)
    trajectories: dict = field(default_factory=dict)
    checkpoints: list = field(default_factory=list)
    events: list = field(default_factory=list)
    requested: str = ""
    on_step: Callable | None = None
    attempt: int = 1
    heartbeats: int = 0

    def step(self, *, step, wall_time, points, trajectories, events):
        self.steps = [s for s in self.steps if s["step"] != step] + [{"step": step, "points": points}]
        self.trajectories.update({t.id: t for t in trajectories})
        self.events += [(kind, message) for kind, message, _ in events]
        if self.on_step:
            self.on_step(step, points)

    def checkpoint(self, *, step, path, size, removed):
        self.checkpoints.append(step)

    def event(self, kind, message, *, step=None, details=None):
        self.events.append((kind, message))

    def heartbeat(self):
        self.heartbeats += 1
        return self.requested

    def rollback(self, step):
        self.steps = [s for s in self.steps if s["step"] <= step]
        self.trajectories = {k: t for k, t in self.trajectories.items() if (t.step or 0) <= step}


class Heartbeat:
    """Proof of life and of progress for the run, every `seconds` on a thread of its own, and at each step's end
    (`beat`): remembers what the owner asked for meanwhile ("pause", "cancel") and whether another worker took the
    run.

    A beat means the attempt is moving, not only that its process is alive: whoever works calls `progressed()`
    (the pipeline: a trajectory rolled out or graded, a step recorded, a checkpoint written; an evaluation: a
    batch archived). Once `stuck_after` seconds pass without it, the thread stops beating and sets `stalled`: the
    run's heartbeat goes stale, so the watchdog takes the attempt for lost and resumes the run elsewhere, and the
    owner abandons the attempt at its next check (AttemptAbandoned). None: beats as long as the process lives."""

    def __init__(self, tracker: Tracker, *, seconds: float = 2.0, stuck_after: float | None = None):
        self.tracker, self.seconds, self.stuck_after = tracker, seconds, stuck_after
        self.requested = ""
        self.lease_lost = False
        self.stalled = False
        self._progress_at = time.monotonic()
        self._stopped = threading.Event()

    def start(self) -> None:
        self.progressed()
        threading.Thread(target=self._loop, name="rl-heartbeat", daemon=True).start()

    def progressed(self) -> None:
        """The attempt did a piece of its work (from any thread)."""
        self._progress_at = time.monotonic()

    def seconds_without_progress(self) -> float:
        return time.monotonic() - self._progress_at

    def stop(self) -> None:
        self._stopped.set()

    def beat(self) -> str:
        """One beat now; raises LeaseLost if the run is no longer this worker's."""
        try:
            self.requested = self.tracker.heartbeat() or ""
        except LeaseLost:
            self.lease_lost = True
            raise
        return self.requested

    def _loop(self) -> None:
        while not self._stopped.is_set():
            if self.stuck_after is not None and self.seconds_without_progress() > self.stuck_after:
                self.stalled = True
                log.warning("no progress for %.0f s (more than %g s): the heartbeat stops, so the run is taken for "
                            "lost and resumed from its newest checkpoint", self.seconds_without_progress(),
                            self.stuck_after)
                return
            try:
                self.beat()
            except LeaseLost:
                return
            except Exception:  # a database blip: try again next beat; the watchdog's timeout is much longer
                pass
            self._stopped.wait(self.seconds)

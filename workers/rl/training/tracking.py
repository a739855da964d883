"""Where the pipeline reports: a Tracker (protocols.py) receives each step's points, trajectories and events, the
checkpoints and the heartbeats. The studio's tracker writes through apps.runs.services (apps/runs/attempts/); the
MemoryTracker keeps everything in lists for tests, benchmarks and notebooks. The Heartbeat keeps the run's lease
while the pipeline runs."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from ..protocols import LeaseLost, Tracker


@dataclass
class MemoryTracker:
    steps: list = field(default_factory=list)
    trajectories: dict = field(default_factory=dict)
    checkpoints: list = field(default_factory=list)
    events: list = field(default_factory=list)
    requested: str = ""
    on_step: Callable | None = None
    attempt: int = 1

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
        return self.requested

    def rollback(self, step):
        self.steps = [s for s in self.steps if s["step"] <= step]
        self.trajectories = {k: t for k, t in self.trajectories.items() if (t.step or 0) <= step}


class Heartbeat:
    """Proof of life for the run, every `seconds` on a thread of its own, and at each step's end (`beat`):
    remembers what the owner asked for meanwhile ("pause", "cancel") and whether another worker took the run."""

    def __init__(self, tracker: Tracker, *, seconds: float = 2.0):
        self.tracker, self.seconds = tracker, seconds
        self.requested = ""
        self.lease_lost = False
        self._stopped = threading.Event()

    def start(self) -> None:
        threading.Thread(target=self._loop, name="rl-heartbeat", daemon=True).start()

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
            try:
                self.beat()
            except LeaseLost:
                return
            except Exception:  # a database blip: try again next beat; the watchdog's timeout is much longer
                pass
            self._stopped.wait(self.seconds)

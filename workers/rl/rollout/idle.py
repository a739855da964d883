"""Where the trainer's idle time goes: shared out among the phases of the trajectories it was waiting for."""

from __future__ import annotations

import threading
from collections import Counter

from ..types import Phase


class PhaseBoard:
    """Which phase each unfinished trajectory is in, and the trainer's idle time shared out among them.

    While the trainer waits for data, `accrue(dt)` splits dt evenly over the unfinished trajectories and adds
    each share to that trajectory's current phase. A trajectory that ends in a timeout hands everything
    accrued to it to `timeouts`: the trainer was really waiting on a rollout that was never going to finish.
    """

    def __init__(self):
        self._lock = threading.Lock()
        self._phase: dict[str, Phase] = {}
        self._accrued: dict[str, Counter] = {}
        self._finished = Counter()

    def set(self, key: str, phase: Phase) -> None:
        with self._lock:
            self._phase[key] = phase

    def finish(self, key: str, *, timed_out: bool = False) -> None:
        with self._lock:
            self._phase.pop(key, None)
            accrued = self._accrued.pop(key, Counter())
            if timed_out:
                self._finished["timeouts"] += sum(accrued.values())
            else:
                self._finished.update(accrued)

    def in_flight(self) -> int:
        with self._lock:
            return len(self._phase)

    def accrue(self, seconds: float) -> None:
        with self._lock:
            if not self._phase:
                self._finished[str(Phase.GENERATION)] += seconds  # nothing in flight: generation has yet to start
                return
            share = seconds / len(self._phase)
            for key, phase in self._phase.items():
                self._accrued.setdefault(key, Counter())[str(phase)] += share

    def drain(self) -> dict[str, float]:
        """Idle seconds by cause since the last drain (what is accrued to unfinished trajectories included)."""
        with self._lock:
            totals = Counter(self._finished)
            for accrued in self._accrued.values():
                totals.update(accrued)
                accrued.clear()
            self._finished.clear()
        return {cause: totals.get(cause, 0.0) for cause in (*(str(p) for p in Phase), "timeouts")}

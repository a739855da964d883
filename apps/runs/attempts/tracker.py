"""What an attempt reports, written through apps.runs.services under the attempt's fence, and a database outage
waited out rather than failing the run."""

from __future__ import annotations

import logging
import threading
import time

from django.conf import settings
from django.db import InterfaceError, OperationalError, connection

from workers.rl.protocols import LeaseLost

from .. import services

log = logging.getLogger(__name__)


class DatabaseUnavailable(Exception):
    """The database did not come back within settings.RUN_DATABASE_OUTAGE_SECONDS: the attempt stops without
    a verdict on the run, which the watchdog resumes from its last checkpoint once the database is back."""


class DatabaseTracker:
    """The pipeline's reports, written through apps.runs.services under this attempt's fence.

    A database that goes away (restarted, failed over, a dropped connection) is waited for: each write is one
    transaction, so it is simply tried again on a fresh connection, with backoff, for up to
    settings.RUN_DATABASE_OUTAGE_SECONDS. Writing a step twice is harmless (points and trajectories are
    upserted by their keys). A write this attempt is no longer allowed to make raises LeaseLost."""

    def __init__(self, run_id, attempt: int):
        self.run_id, self.attempt = run_id, attempt
        self.owner = threading.current_thread()  # the attempt's thread; the heartbeat thread is another

    def _fenced(self, call, **kwargs):
        deadline, pause = time.monotonic() + settings.RUN_DATABASE_OUTAGE_SECONDS, 0.25
        while True:
            try:
                return call(run_id=self.run_id, attempt=self.attempt, **kwargs)
            except services.RunLeaseLost as exc:
                raise LeaseLost(str(exc)) from None
            except (OperationalError, InterfaceError) as exc:
                connection.close()  # this thread's broken connection; the next call opens a new one
                if time.monotonic() + pause > deadline:
                    raise DatabaseUnavailable(f"the database did not answer for "
                                              f"{settings.RUN_DATABASE_OUTAGE_SECONDS:g} s: {exc}") from exc
                log.warning("run %s: the database did not answer (%s); trying again in %.1f s", self.run_id,
                            exc, pause)
                time.sleep(pause)
                pause = min(pause * 2, 5.0)

    def step(self, *, step, wall_time, points, trajectories, events):
        self._fenced(services.run_step_record, step=step, wall_time=wall_time, points=points,
                     trajectories=list(trajectories), events=list(events))

    def checkpoint(self, *, step, path, size, removed):
        self._fenced(services.run_checkpoint_record, step=step, path=path, size=size, removed=removed)

    def event(self, kind, message, *, step=None, details=None):
        self._fenced(services.run_event_record, kind=kind, message=message, step=step, details=details)

    def heartbeat(self) -> str:
        try:
            return self._fenced(services.run_heartbeat)
        finally:
            if threading.current_thread() is not self.owner:
                # The pipeline's heartbeat thread has a connection of its own: one per beat, so none is left
                # open when the thread ends.
                connection.close()

    def rollback(self, step: int) -> None:
        self._fenced(services.run_rollback, step=step)

    def finish(self, *, status: str, summary: dict) -> None:
        """The attempt's last word (not part of the engine's Tracker protocol: the engine only reports)."""
        self._fenced(services.run_finish, status=status, summary=summary)

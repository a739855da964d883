"""One attempt at a run, whatever its kind, and its one failure policy.

An attempt is what a worker does with a run it claimed (`run_claim` hands it the attempt number, its fencing
token): the kinds (training.py, evaluation.py, reference.py) write only their work, `execute`; what happens when
it stops early is decided here, once, for all of them. It ends with the run's summary (whose outcome is the run's
last word: completed, paused, cancelled or interrupted), or, without a word on the run, `Unfinished`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
import traceback
from collections.abc import Iterator
from enum import StrEnum

from django.conf import settings
from django.db import InterfaceError, OperationalError, connection

from apps.common import wiring
from apps.registry.pins import PinnedBundleError
from workers.rl.protocols import AttemptAbandoned, LeaseLost
from workers.rl.training.tracking import Heartbeat
from workers.storage import StorageUnavailable

from .. import services
from ..models import Run, RunStatus
from .tracker import DatabaseTracker, DatabaseUnavailable

log = logging.getLogger(__name__)

# Set when the interpreter starts exiting (the embedded studio stopped with Ctrl-C or SIGTERM): the process was asked
# to stop, and its attempts end interrupted at their next step or batch (the run resumes there). Registered with
# threading's exit hooks, the ones concurrent.futures uses to make executors refuse new work at exit: those run
# while the main thread still counts as alive, and hooks run newest first, so this is set before the pipeline's
# executors start refusing. (Checking `main_thread().is_alive()` instead raced with them.)
process_exiting = threading.Event()
threading._register_atexit(process_exiting.set)


@contextlib.contextmanager
def stop_on_signals() -> Iterator[None]:
    """For a process whose main thread waits on its attempt (`train --headless`, `evaluate --headless`): the first
    SIGINT or SIGTERM asks the attempt to stop as the embedded studio's stop does — the step it finished is
    checkpointed and the run marked interrupted — rather than a KeyboardInterrupt leaving the run "running" with
    nothing running. A second signal exits at once. Outside the main thread (no handlers can be set there) it does
    nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def asked(signum, _frame):
        if process_exiting.is_set():
            sys.stderr.write(f"{signal.Signals(signum).name} again: exiting now\n")
            sys.stderr.flush()
            os._exit(128 + signum)
        sys.stderr.write(f"{signal.Signals(signum).name}: stopping; the run keeps the last step it finished (its "
                         "checkpoint) and is marked interrupted (a second signal exits at once)\n")
        sys.stderr.flush()
        process_exiting.set()

    previous = {signum: signal.signal(signum, asked) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        # This process goes on (a test, a shell calling the command twice): the next attempt must not stop at once.
        process_exiting.clear()


OUTCOME_STATUS = {"completed": RunStatus.COMPLETED, "paused": RunStatus.PAUSED, "cancelled": RunStatus.CANCELLED,
                  "interrupted": RunStatus.INTERRUPTED}


class Unfinished(StrEnum):
    """How an attempt ended without a word on the run."""

    TAKEN_OVER = "taken over"  # another attempt holds the run: this one wrote nothing more
    # The infrastructure stopped it (the database or the object store stayed away, the process exited under it) or it
    # made no progress for too long: the run is left running, and resumed from its newest checkpoint once its
    # heartbeat is stale.
    LEFT_TO_RESUME = "left to resume"


# Where the infrastructure, not the run, stopped the attempt: nothing can be written (or nothing should be), and
# the run is left running, so its heartbeat goes stale and the watchdog (or the next embedded studio) resumes it.
INFRASTRUCTURE_AWAY = (DatabaseUnavailable, OperationalError, InterfaceError, StorageUnavailable)
# The run's own mistakes (a bundle that no longer resolves, a config a worker cannot serve, a checkpoint that is
# gone): its error says them in their words; anything else also carries the traceback's tail.
RUN_MISTAKES = (PinnedBundleError, ValueError, FileNotFoundError)


class Attempt:
    """One attempt at a run; a kind subclasses it and writes `execute`. The failure policy, the same for every
    kind:

    - another attempt took the run over (the lease is lost): stop, write nothing more (Unfinished.TAKEN_OVER);
    - the database or the object store stayed away past their outage windows, the process exited under the work,
      or the attempt made no progress for settings.RUN_STUCK_SECONDS (AttemptAbandoned): stop without a verdict;
      the run is left to be resumed from where it last recorded progress (Unfinished.LEFT_TO_RESUME);
    - anything else: the run fails, with the error.

    A stop the process was asked for (`stop_asked`) is not a failure: the kind ends its work at the next step or
    batch and says so in its summary (outcome "interrupted"), and the run resumes there at the next start.

    What `execute` opens it hands to `closing`, which closes it on every way out. While it works, the run's
    heartbeat is beaten on a thread of its own (`heartbeat`), so a long evaluation or reference check is never
    taken for a lost one, unless `execute` beats it itself. A kind that reports its progress to it
    (`heartbeat.progressed()`, `reports_progress`) is taken for lost once it stops making any."""

    # The training pipeline beats the heartbeat itself (on its own thread, and at every step's end, where a pause
    # or a cancel is acted on).
    beats_itself = False
    # Whether `execute` calls heartbeat.progressed() as it works: then its heartbeat stops after
    # settings.RUN_STUCK_SECONDS without progress. A reference check is one step with nothing to report before
    # its end: its heartbeat is proof of life only.
    reports_progress = False

    def __init__(self, run: Run, attempt: int, *, progress=None, pretrain_progress=None):
        self.run, self.attempt = run, attempt
        self.config = run.run_config
        self.tracker = DatabaseTracker(run.pk, attempt)
        self.heartbeat = Heartbeat(self.tracker,
                                   stuck_after=settings.RUN_STUCK_SECONDS if self.reports_progress else None)
        self.progress, self.pretrain_progress = progress, pretrain_progress
        self._opened: list = []

    def execute(self) -> dict:
        """The run's work, to its end: returns the summary, whose `outcome` is completed, paused, cancelled or
        interrupted."""
        raise NotImplementedError

    def finished(self, summary: dict) -> None:
        """After the run's last word is written: what the kind leaves tidy."""

    @property
    def stop_asked(self) -> bool:
        """Whether the process was asked to stop: a kind that works in batches then returns its summary as
        interrupted before its next batch (a training loop does the same at its next step)."""
        return process_exiting.is_set()

    def check(self) -> None:
        """For a kind that works in batches: raises AttemptAbandoned once the attempt made no progress for too long
        (the training loop checks the same itself)."""
        if self.heartbeat.stalled:
            raise AttemptAbandoned(f"no progress for {self.heartbeat.stuck_after:g} s")

    def closing(self, resource):
        """`resource` (anything with close()) is closed when the attempt ends, newest first."""
        self._opened.append(resource)
        return resource

    def carry_out(self) -> dict | Unfinished:
        """The attempt to its end. Returns the summary, or how it stopped without a verdict."""
        run_id, attempt = self.run.pk, self.attempt
        try:
            if not self.beats_itself:
                self.heartbeat.start()
            summary = self.execute()
            self.tracker.finish(status=OUTCOME_STATUS[summary["outcome"]], summary=summary)
            self.finished(summary)
            return summary
        except LeaseLost:
            log.warning("run %s attempt %s was taken over; stopping without writing", run_id, attempt)
            return Unfinished.TAKEN_OVER
        except AttemptAbandoned as exc:
            log.warning("run %s attempt %s abandoned: %s; it will be resumed", run_id, attempt, exc)
            return Unfinished.LEFT_TO_RESUME
        except INFRASTRUCTURE_AWAY as exc:
            log.exception("run %s attempt %s stopped: the %s is unavailable; it will be resumed", run_id, attempt,
                          "object store" if isinstance(exc, StorageUnavailable) else "database")
            return Unfinished.LEFT_TO_RESUME
        except Exception as exc:
            if process_exiting.is_set() or not threading.main_thread().is_alive():
                # The process is exiting: its executors refuse new work and the work fails on that. The run is
                # not at fault: it is left running, and resumed, as after a kill.
                log.warning("run %s attempt %s stopped by the process exiting; it will be resumed", run_id, attempt)
                return Unfinished.LEFT_TO_RESUME
            fail_attempt(run_id, attempt, str(exc) if isinstance(exc, RUN_MISTAKES)
                         else f"{type(exc).__name__}: {exc}\n{traceback.format_exc()[-4000:]}")
            raise
        finally:
            self.heartbeat.stop()
            self._close()

    def _close(self) -> None:
        for resource in reversed(self._opened):
            try:
                resource.close()
            except Exception:  # closing must not hide why the attempt ended
                log.exception("run %s attempt %s: could not close %r", self.run.pk, self.attempt, resource)
        self._opened.clear()
        # The attempt's connection goes with it (a worker holds one per attempt, not one per process forever);
        # a caller inside a transaction (a command called from a test, or another atomic block) keeps its own.
        if not connection.in_atomic_block:
            connection.close()


def fail_attempt(run_id, attempt: int, error: str) -> None:
    """Mark the run failed with `error`, unless another attempt has taken it over meanwhile."""
    try:
        services.run_finish(run_id=run_id, attempt=attempt, status=RunStatus.FAILED, error=error)
    except services.RunLeaseLost:
        return  # the attempt that took it over still serves its weights
    remove_weights(run_id)


def remove_weights(run_id) -> None:
    """The weights a run that ended published for its inference servers (`weights/<run id>/`, the engine keeps
    the two newest versions there while it runs): nobody loads them any more. Not removing them costs space,
    never the run: a storage error is logged."""
    try:
        wiring.weights_storage(run_id).remove("")
    except OSError:
        log.warning("run %s: could not remove its published weights from the storage", run_id, exc_info=True)

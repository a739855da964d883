"""One attempt at a run: wire the engine from the run's pinned bundle and config, build its pipeline, run it,
and persist what it reports through the services (fenced by the attempt).

Called by the Celery task on the `gpu` queue, by the embedded studio's training thread, and by
`manage.py train --headless`; all three run the same code.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path

from django.conf import settings
from django.db import InterfaceError, OperationalError, connection

from apps.common import wiring
from apps.registry.pins import PinnedBundleError, bundle_tasks
from workers.rl import distributed
from workers.rl.config import REFERENCE_MODEL, RunConfig
from workers.rl.session import build_pipeline
from workers.rl.tracking import LeaseLost
from workers.storage import StorageUnavailable
from workers.telemetry import log_context

from . import services
from .models import Run, RunStatus

log = logging.getLogger(__name__)

# Set when the interpreter starts exiting (the embedded studio stopped with Ctrl-C or SIGTERM). Registered with
# threading's exit hooks, the ones concurrent.futures uses to make executors refuse new work at exit: those run
# while the main thread still counts as alive, and hooks run newest first, so this is set before the pipeline's
# executors start refusing. (Checking `main_thread().is_alive()` instead raced with them.)
process_exiting = threading.Event()
threading._register_atexit(process_exiting.set)

OUTCOME_STATUS = {"completed": RunStatus.COMPLETED, "paused": RunStatus.PAUSED, "cancelled": RunStatus.CANCELLED}


class DatabaseUnavailable(Exception):
    """The database did not come back within settings.RUN_DATABASE_OUTAGE_SECONDS: the attempt stops without
    a verdict on the run, which the watchdog resumes from its last checkpoint once the database is back."""


class DatabaseTracker:
    """The pipeline's reports, written through apps.runs.services under this attempt's fence.

    A database that goes away (restarted, failed over, a dropped connection) is waited for: each write is one
    transaction, so it is simply tried again on a fresh connection, with backoff, for up to
    settings.RUN_DATABASE_OUTAGE_SECONDS. Writing a step twice is harmless (points and trajectories are
    upserted by their keys)."""

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


def run_attempt(*, run_id, attempt: int, progress=None, pretrain_progress=None) -> dict | None:
    """Runs the attempt to its end; returns the summary, or None if the run was taken over meanwhile."""
    with log_context(run=run_id, attempt=attempt):  # every log line of the attempt names it
        return _run_attempt(run_id=run_id, attempt=attempt, progress=progress, pretrain_progress=pretrain_progress)


def _run_attempt(*, run_id, attempt: int, progress, pretrain_progress) -> dict | None:
    run = Run.objects.select_related("bundle__definition__project", "project").get(pk=run_id)
    config = RunConfig.from_dict(run.config)
    if config.model == REFERENCE_MODEL:  # a reference check whose first attempt was lost: it is checked again
        from .reference import reference_check

        return reference_check(run_id=run_id, attempt=attempt)
    if config.evaluation:  # an eval suite's evaluation: nothing is trained
        from .evaluation import evaluation_run

        return evaluation_run(run_id=run_id, attempt=attempt)
    if config.data_parallel > 1 and distributed.current() is None:
        return _train_on_ranks(run, attempt, processes=config.data_parallel)
    pool = model = None
    try:
        tasks = bundle_tasks(bundle=run.bundle, config=config)
        model = wiring.run_model(config, tasks, progress=pretrain_progress, run_id=run.pk)
        pool = wiring.sandbox_pool()
        for template in tasks.templates.values():
            pool.warm(template.image)
        tool_runner, verifier = wiring.run_runners(pool, config)
        tracker = DatabaseTracker(run.pk, attempt)
        pipeline = build_pipeline(run_id=str(run.pk), config=config, total_steps=run.steps_total, tasks=tasks,
                                  model=model, tool_runner=tool_runner, verifier=verifier, tracker=tracker,
                                  checkpoint_dir=wiring.checkpoint_dir(run.pk), prices=wiring.prices(),
                                  progress=progress)
        summary = pipeline.run()
        tracker.finish(status=OUTCOME_STATUS[summary["outcome"]], summary=summary)
        if summary["outcome"] != "paused":  # a paused run publishes its weights again when it resumes
            remove_weights(run.pk)
        return summary
    except (LeaseLost, services.RunLeaseLost):
        log.warning("run %s attempt %s was taken over; stopping without writing", run_id, attempt)
        return None
    except (DatabaseUnavailable, StorageUnavailable) as exc:
        # Not the run's fault, and nothing can be written anyway: its heartbeat goes stale and the watchdog
        # resumes it from its last checkpoint once the database (or the object store) is back.
        log.exception("run %s attempt %s stopped: the %s is unavailable; it will be resumed", run_id, attempt,
                      "database" if isinstance(exc, DatabaseUnavailable) else "object store")
        return None
    except (PinnedBundleError, ValueError, FileNotFoundError) as exc:
        fail_attempt(run.pk, attempt, str(exc))
        raise
    except Exception as exc:
        if process_exiting.is_set() or not threading.main_thread().is_alive():
            # The process is exiting (the embedded studio stopped with Ctrl-C or SIGTERM): its executors refuse
            # new work and the pipeline fails on that. The run is not at fault: leave it running, so that its
            # heartbeat goes stale and the watchdog (or the next embedded studio) resumes it from its checkpoint,
            # as after a kill.
            log.warning("run %s attempt %s stopped by the process exiting; it will be resumed", run_id, attempt)
            return None
        fail_attempt(run.pk, attempt, f"{type(exc).__name__}: {exc}\n{traceback.format_exc()[-4000:]}")
        raise
    finally:
        if model is not None:
            model.close()
        if pool is not None:
            pool.close()
        connection.close()


MANAGE = Path(__file__).resolve().parents[2] / "manage.py"


def _train_on_ranks(run: Run, attempt: int, *, processes: int) -> dict | None:
    """A data-parallel run's attempt: `processes` processes on this host started by torchrun (`manage.py train
    --attempt`, workers/rl/distributed.py), whose rank 0 trains the attempt this worker claimed exactly as this
    function would in this process (the lease, heartbeats, archive, checkpoints); this process waits for them.
    They inherit this process's environment (database, storage, devices); their output goes to a log file in the
    data directory. If they exit without finishing the run — a rank killed, out of memory — the attempt fails with
    the log's tail, unless another worker has taken the run over meanwhile."""
    logs = Path(settings.DATA_DIR) / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    log_path = logs / f"run-{run.pk}-attempt-{attempt}.log"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(processes),
               str(MANAGE), "train", "--attempt", f"{run.pk}:{attempt}", "--headless", "--json"]
    log.info("run %s attempt %s: training on %d processes (%s)", run.pk, attempt, processes, log_path)
    with log_path.open("w") as output:
        done = subprocess.run(command, cwd=MANAGE.parent, stdout=subprocess.PIPE, stderr=output, text=True)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode == 0 and lines:
        return json.loads(lines[-1])
    run.refresh_from_db()
    if run.attempt != attempt:
        log.warning("run %s attempt %s was taken over while its processes trained", run.pk, attempt)
        return None
    tail = log_path.read_text(errors="replace")[-3000:]
    if run.status == RunStatus.RUNNING:  # rank 0 did not get to say why: a rank was killed, or torchrun failed
        fail_attempt(run.pk, attempt, f"the {processes} trainer processes exited with {done.returncode} "
                                      f"({log_path}):\n{tail}")
    raise RuntimeError(f"run {run.pk} attempt {attempt}: the trainer processes exited with {done.returncode}; "
                       f"see {log_path}")


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

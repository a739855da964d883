"""One attempt at a run: wire the engine from the run's pinned bundle and config, build its pipeline, run it,
and persist what it reports through the services (fenced by the attempt).

Called by the Celery task on the `gpu` queue, by the embedded studio's training thread, and by
`manage.py train --headless`; all three run the same code.
"""

from __future__ import annotations

import logging
import threading
import traceback

from django.db import close_old_connections, connection

from workers.rl.config import RunConfig
from workers.rl.session import build_pipeline
from workers.rl.tracking import LeaseLost

from . import services, wiring
from .models import Run, RunStatus
from .pins import PinnedBundleError, bundle_tasks

log = logging.getLogger(__name__)

# Set when the interpreter starts exiting (the embedded studio stopped with Ctrl-C or SIGTERM). Registered with
# threading's exit hooks, the ones concurrent.futures uses to make executors refuse new work at exit: those run
# while the main thread still counts as alive, and hooks run newest first, so this is set before the pipeline's
# executors start refusing. (Checking `main_thread().is_alive()` instead raced with them.)
process_exiting = threading.Event()
threading._register_atexit(process_exiting.set)

OUTCOME_STATUS = {"completed": RunStatus.COMPLETED, "paused": RunStatus.PAUSED, "cancelled": RunStatus.CANCELLED}


class DatabaseTracker:
    """The pipeline's reports, written through apps.runs.services under this attempt's fence."""

    def __init__(self, run_id, attempt: int):
        self.run_id, self.attempt = run_id, attempt

    def _fenced(self, call, **kwargs):
        try:
            return call(run_id=self.run_id, attempt=self.attempt, **kwargs)
        except services.RunLeaseLost as exc:
            raise LeaseLost(str(exc)) from None

    def step(self, *, step, wall_time, points, trajectories, events):
        self._fenced(services.run_step_record, step=step, wall_time=wall_time, points=points,
                     trajectories=list(trajectories), events=list(events))

    def checkpoint(self, *, step, path, size, removed):
        self._fenced(services.run_checkpoint_record, step=step, path=path, size=size, removed=removed)

    def event(self, kind, message, *, step=None, details=None):
        self._fenced(services.run_event_record, kind=kind, message=message, step=step, details=details)

    def heartbeat(self) -> str:
        close_old_connections()  # called from the pipeline's heartbeat thread, on that thread's own connection
        return self._fenced(services.run_heartbeat)

    def rollback(self, step: int) -> None:
        self._fenced(services.run_rollback, step=step)


def run_attempt(*, run_id, attempt: int, progress=None, pretrain_progress=None) -> dict | None:
    """Runs the attempt to its end; returns the summary, or None if the run was taken over meanwhile."""
    run = Run.objects.select_related("bundle__definition__project", "project").get(pk=run_id)
    config = RunConfig.from_dict(run.config)
    pool = model = None
    try:
        tasks = bundle_tasks(bundle=run.bundle, config=config)
        model = wiring.run_model(config, tasks, progress=pretrain_progress)
        pool = wiring.sandbox_pool()
        for template in tasks.templates.values():
            pool.warm(template.image)
        tool_runner, verifier = wiring.run_runners(pool, config)
        pipeline = build_pipeline(run_id=str(run.pk), config=config, total_steps=run.steps_total, tasks=tasks,
                                  model=model, tool_runner=tool_runner, verifier=verifier,
                                  tracker=DatabaseTracker(run.pk, attempt),
                                  checkpoint_dir=wiring.checkpoint_dir(run.pk),
                                  prices=wiring.prices(), progress=progress)
        summary = pipeline.run()
        services.run_finish(run_id=run.pk, attempt=attempt, status=OUTCOME_STATUS[summary["outcome"]], summary=summary)
        return summary
    except (LeaseLost, services.RunLeaseLost):
        log.warning("run %s attempt %s was taken over; stopping without writing", run_id, attempt)
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


def fail_attempt(run_id, attempt: int, error: str) -> None:
    """Mark the run failed with `error`, unless another attempt has taken it over meanwhile."""
    try:
        services.run_finish(run_id=run_id, attempt=attempt, status=RunStatus.FAILED, error=error)
    except services.RunLeaseLost:
        pass

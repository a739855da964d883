"""One attempt at a run: build the engine from the run's pinned bundle and config, run the pipeline, and
persist everything it reports through the services (fenced by the attempt).

Called by the Celery task on the `gpu` queue, by the embedded runner in the web process, and by
`manage.py train --headless`; all three run the same code.
"""

from __future__ import annotations

import base64
import logging
import threading
import traceback
from pathlib import Path

from django.conf import settings
from django.db import close_old_connections, connection, transaction

from apps.trajectories.models import Trajectory as ArchivedTrajectory
from workers.rl.config import RunConfig
from workers.rl.metrics import Prices
from workers.rl.pipeline import LeaseLost, LocalVerifier, Pipeline, TaskCatalog
from workers.rl.scheduler import Curriculum, Scheduler
from workers.rl.tools import SandboxToolRunner
from workers.rl.trainer import GRPOTrainer
from workers.sandbox import SandboxPool
from workers.sandbox.backends import backend_named

from . import services
from .models import MetricPoint, Run, RunStatus
from .pinned import PinnedBundleError, pinned_bundle
from .policies import build_policy

log = logging.getLogger(__name__)


def checkpoint_dir(run_id) -> Path:
    return Path(settings.DATA_DIR) / "checkpoints" / str(run_id)


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
        payload = []
        for trajectory in trajectories:
            data = trajectory.to_json()
            data["artifacts"] = {name: base64.b64encode(blob).decode() for name, blob in trajectory.artifacts.items()}
            payload.append(data)
        self._fenced(services.run_step_record, step=step, wall_time=wall_time, points=points, trajectories=payload,
                     events=list(events))

    def checkpoint(self, *, step, path, size, removed):
        self._fenced(services.run_checkpoint_record, step=step, path=path, size=size, removed=removed)

    def event(self, kind, message, *, step=None, details=None):
        self._fenced(services.run_event_record, kind=kind, message=message, step=step, details=details)

    def heartbeat(self) -> str:
        close_old_connections()  # called from the pipeline's heartbeat thread, on that thread's own connection
        return self._fenced(services.run_heartbeat)

    def rollback(self, step: int) -> None:
        """What earlier attempts archived after `step` is replayed by this one: take it back first."""
        with transaction.atomic():
            services._fenced(self.run_id, self.attempt)
            MetricPoint.objects.filter(run_id=self.run_id, step__gt=step).delete()
            ArchivedTrajectory.objects.filter(run_id=self.run_id, step__gt=step).delete()
            Run.objects.filter(pk=self.run_id).update(step=step)


def run_attempt(*, run_id, attempt: int, progress=None, pretrain_progress=None) -> dict | None:
    """Runs the attempt to its end; returns the summary, or None if the run was taken over meanwhile."""
    run = Run.objects.select_related("bundle__definition__project", "project").get(pk=run_id)
    config = RunConfig.from_dict(run.config)
    tracker = DatabaseTracker(run.pk, attempt)
    pool = engine = None
    try:
        pinned = pinned_bundle(bundle=run.bundle, config=config)
        policy, engine, chat = build_policy(config, pinned, progress=pretrain_progress)
        pool = SandboxPool(backend_named(settings.SANDBOX_BACKEND), status_dir=settings.SANDBOX_STATUS_DIR)
        for template in pinned.templates.values():
            pool.warm(template.image)
        tool_runner, verifier = _runners(pool, config)
        scheduler = Scheduler(pinned.domains, seed=config.seed, curriculum=Curriculum() if config.curriculum else None)
        pipeline = Pipeline(
            run_id=str(run.pk), config=config, total_steps=run.steps_total,
            catalog=TaskCatalog(pinned.templates, pinned.item, pinned.item_hash), scheduler=scheduler,
            engine=engine, chat=chat, policy=policy, trainer=GRPOTrainer(policy, config=config, total_steps=run.steps_total),
            tool_runner=tool_runner, verifier=verifier, tracker=tracker, checkpoint_dir=checkpoint_dir(run.pk),
            prices=Prices(gpu_per_hour=settings.GPU_PRICE_PER_HOUR,
                          sandbox_cpu_per_hour=settings.SANDBOX_CPU_PRICE_PER_HOUR),
            eval_tasks=pinned.eval_tasks(per_domain=config.eval_tasks_per_domain, seed=config.seed),
            progress=progress)
        summary = pipeline.run()
        status = {"completed": RunStatus.COMPLETED, "paused": RunStatus.PAUSED,
                  "cancelled": RunStatus.CANCELLED}[summary["outcome"]]
        services.run_finish(run_id=run.pk, attempt=attempt, status=status, summary=summary)
        return summary
    except (LeaseLost, services.RunLeaseLost):
        log.warning("run %s attempt %s was taken over; stopping without writing", run_id, attempt)
        return None
    except (PinnedBundleError, ValueError, FileNotFoundError) as exc:
        _fail(run.pk, attempt, str(exc))
        raise
    except Exception as exc:
        if not threading.main_thread().is_alive():
            # The process is exiting (the embedded studio stopped with Ctrl-C or SIGTERM): its executors refuse
            # new work and the pipeline fails on that. The run is not at fault: leave it running, so that its
            # heartbeat goes stale and the watchdog (or the next embedded runner) resumes it from its checkpoint,
            # as after a kill.
            log.warning("run %s attempt %s stopped by the process exiting; it will be resumed", run_id, attempt)
            return None
        _fail(run.pk, attempt, f"{type(exc).__name__}: {exc}\n{traceback.format_exc()[-4000:]}")
        raise
    finally:
        if engine is not None:
            engine.close()
        if pool is not None:
            pool.close()
        connection.close()


def _fail(run_id, attempt: int, error: str) -> None:
    try:
        services.run_finish(run_id=run_id, attempt=attempt, status=RunStatus.FAILED, error=error)
    except services.RunLeaseLost:
        pass


def _runners(pool, config: RunConfig):
    """Tool calls and verification: on the rollout and verify queues when Celery has a broker and the
    settings ask for it, else in this process over `pool`."""
    if settings.REMOTE_ROLLOUTS:
        from workers.tasks import CeleryToolRunner, CeleryVerifier

        return CeleryToolRunner(max_output_chars=config.max_tool_output_chars), CeleryVerifier()
    return SandboxToolRunner(pool, max_output_chars=config.max_tool_output_chars), LocalVerifier(pool, _judge())


def _judge():
    if not settings.JUDGE_BASE_URL:
        return None
    from apps.registry.pinned import verification_context

    return verification_context(pool=None, image=None).judge

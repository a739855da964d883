"""Celery tasks: the only module under workers/ that touches Django. Each loads what it needs, calls the engine
or a service, and hands back plain data; the wiring of engine objects is apps/common/wiring.py's.

Queues: `gpu` runs a run's attempt (the trainer and the inference engine); `rollout` runs tool calls in this
worker's sandbox pool; `verify` runs verifications. A run's attempt sends tool calls and verifications to the
other two queues by task name (workers/remote.py) when the studio runs on services with remote rollouts on, so
rollout and verification workers scale apart from the GPU ones.

`runs_watchdog` (Celery beat) queues again the runs whose worker stopped heartbeating; their next attempt
resumes from the last checkpoint. A train_run delivered twice (acks_late redelivery after a lost worker)
is harmless: the claim lets only one attempt through.
"""

from __future__ import annotations

import threading

from celery import shared_task
from celery.signals import worker_process_shutdown
from django.conf import settings

from workers.remote import tool_result_to_wire, verdict_to_wire
from workers.rl.rollout.grading import LocalVerifier
from workers.rl.rollout.tools import PolicyToolError, SandboxToolRunner
from workers.rl.types import TaskTemplate, Trajectory
from workers.sandbox import SandboxImage
from workers.telemetry import log_context
from workers.verifiers import Item

_pool = None
_verifier = None
_lock = threading.Lock()


def sandbox_pool():
    """This worker process's sandbox pool, made on first use and shared by its tasks."""
    from apps.common import wiring

    global _pool
    with _lock:
        if _pool is None:
            _pool = wiring.sandbox_pool()
        return _pool


def local_verifier() -> LocalVerifier:
    """This worker process's verifier: its sandbox pool and one judge client (one cache, one concurrency cap)."""
    from apps.common import wiring

    global _verifier
    pool = sandbox_pool()
    with _lock:
        if _verifier is None:
            _verifier = LocalVerifier(pool, wiring.judge_client())
        return _verifier


@worker_process_shutdown.connect
def _close_pool(**_):
    if _pool is not None:
        _pool.close()


@shared_task(name="workers.tasks.train_run", acks_late=True)
def train_run(run_id: str) -> str:
    from apps.runs.attempts import run_attempt
    from apps.runs.services import run_claim

    attempt = run_claim(run_id=run_id, stale_after=settings.RUN_STALE_SECONDS)
    if attempt is None:
        return f"run {run_id} is not claimable (another worker has it, or it is not queued)"
    summary = run_attempt(run_id=run_id, attempt=attempt)
    return "taken over" if summary is None else summary["outcome"]


@shared_task(name="workers.tasks.runs_watchdog")
def runs_watchdog() -> list[str]:
    from apps.runs.services import runs_requeue_lost

    requeued = [str(run.pk) for run in runs_requeue_lost(stale_after=settings.RUN_STALE_SECONDS)]
    for run_id in requeued:
        train_run.apply_async((run_id,))
    return requeued


@shared_task(name="workers.tasks.execute_tool_call", acks_late=True)
def execute_tool_call(image: dict, name: str, arguments: dict, max_output_chars: int) -> dict:
    runner = SandboxToolRunner(sandbox_pool(), max_output_chars=max_output_chars)
    try:
        result = runner.run(SandboxImage.from_json(image), name, arguments)
    except PolicyToolError as exc:
        return {"policy_error": str(exc)}
    return tool_result_to_wire(result)


@shared_task(name="workers.tasks.verify_trajectory", acks_late=True)
def verify_trajectory(template: dict, trajectory: dict, item: dict) -> dict:
    with log_context(run=trajectory.get("run_id"), trajectory=trajectory.get("id")):
        verdict = local_verifier().verify(TaskTemplate.from_json(template), Trajectory.from_json(trajectory),
                                          Item(**item))
    return verdict_to_wire(verdict)


@shared_task(name="workers.tasks.read_task_upload", acks_late=True)
def read_task_upload(upload_id: str, key: str) -> None:
    """Read a large task file uploaded in the browser (apps/registry/upload_jobs.py), on the `studio` queue."""
    from apps.registry.upload_jobs import job_run

    job_run(upload_id, key)

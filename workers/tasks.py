"""Celery tasks: the only module under workers/ that touches Django. Each loads what it needs, calls the engine
or a service, and hands back plain data; the wiring of engine objects is apps/common/wiring.py's.

Queues: `gpu` runs a run's attempt (the trainer and the inference engine); `rollout` runs tool calls in this
worker's sandbox pool, and opens sandbox sessions whose later calls come on this worker's own
`sessions.<worker>` queue (workers/remote.py; studio/celery.py subscribes every rollout worker to its own);
`verify` runs verifications. A run's attempt sends tool calls and verifications to the
other two queues by task name (workers/remote.py) when the studio runs on services with remote rollouts on, so
rollout and verification workers scale apart from the GPU ones.

`runs_watchdog` (Celery beat) queues again the runs whose worker stopped heartbeating, and the runs whose process
was asked to stop (interrupted); their next attempt resumes from the last checkpoint. A train_run delivered twice
(acks_late redelivery after a lost worker) is harmless: the claim lets only one attempt through.
"""

from __future__ import annotations

import os
import threading

from celery import shared_task
from celery.signals import worker_process_shutdown
from django.conf import settings

from workers.remote import session_queue, tool_result_to_wire, verdict_to_wire
from workers.rl.rollout.grading import LocalVerifier
from workers.rl.rollout.sessions import open_local_session
from workers.rl.rollout.tools import PolicyToolError, SandboxToolRunner
from workers.rl.types import TaskTemplate, Trajectory
from workers.sandbox import SandboxImage
from workers.telemetry import log_context
from workers.verifiers import Item

_pool = None
_verifier = None
_lock = threading.Lock()
# The sandbox sessions this worker holds (session id -> sessions.LocalToolSession), for the calls that come on its
# sessions queue. They live in this process: a worker whose tasks run in forked children cannot serve them.
_sessions: dict = {}
MAIN_PROCESS = os.getpid()  # the worker's own process (imported before any child is forked)


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
    ending = run_attempt(run_id=run_id, attempt=attempt)
    return ending if isinstance(ending, str) else ending["outcome"]  # a summary, or attempts.Unfinished


@shared_task(name="workers.tasks.runs_watchdog")
def runs_watchdog() -> list[str]:
    from apps.runs.models import Run, RunStatus
    from apps.runs.services import run_request, runs_requeue_lost

    requeued = [str(run.pk) for run in runs_requeue_lost(stale_after=settings.RUN_STALE_SECONDS)]
    for run_id in requeued:
        train_run.apply_async((run_id,))
    interrupted = list(Run.objects.filter(status=RunStatus.INTERRUPTED))
    for run in interrupted:  # queued again for the gpu workers (run_request sends it once queued)
        run_request(run=run, action="resume", actor=None, via="watchdog")
    return requeued + [str(run.pk) for run in interrupted]


@shared_task(name="workers.tasks.execute_tool_call", acks_late=True)
def execute_tool_call(image: dict, name: str, arguments: dict, max_output_chars: int) -> dict:
    runner = SandboxToolRunner(sandbox_pool(), max_output_chars=max_output_chars)
    try:
        result = runner.run(SandboxImage.from_json(image), name, arguments)
    except PolicyToolError as exc:
        return {"policy_error": str(exc)}
    return tool_result_to_wire(result)


# Not acks_late: a redelivered open would open a second sandbox that nobody closes.
@shared_task(name="workers.tasks.open_tool_session", bind=True)
def open_tool_session(self, template: dict, item: dict, max_output_chars: int) -> dict:
    if os.getpid() != MAIN_PROCESS:
        return {"error": "this rollout worker runs its tasks in forked children, where a session's later calls "
                         "cannot reach it: start rollout workers with -P threads (or -P solo) to serve sessions"}
    worker = self.request.hostname
    for session_id, held in list(_sessions.items()):  # sessions given back by the pool (idle, lifetime, died)
        if not held.session.alive:
            _sessions.pop(session_id, None)
    runner = SandboxToolRunner(sandbox_pool(), max_output_chars=max_output_chars)
    try:
        session = open_local_session(runner, TaskTemplate.from_json(template), Item.from_json(item))
    except Exception as exc:  # the pool or the image: an infrastructure error of that trajectory
        return {"error": f"{worker} could not open a session: {type(exc).__name__}: {exc}"}
    _sessions[session.id] = session
    return {"session": session.id, "host": worker, "queue": session_queue(worker)}


@shared_task(name="workers.tasks.session_tool_call")
def session_tool_call(session_id: str, name: str, arguments: dict) -> dict:
    session = _sessions.get(session_id)
    if session is None:
        return {"lost": f"no session {session_id} on this worker (it ended, or the worker restarted)"}
    try:
        result = session.run(name, arguments)
    except PolicyToolError as exc:
        return {"policy_error": str(exc)}
    if result.status == "infra_error":
        _sessions.pop(session_id, None)
        session.close()
    return tool_result_to_wire(result)


@shared_task(name="workers.tasks.close_tool_session")
def close_tool_session(session_id: str) -> None:
    session = _sessions.pop(session_id, None)
    if session is not None:
        session.close()


@shared_task(name="workers.tasks.verify_trajectory", acks_late=True)
def verify_trajectory(template: dict, trajectory: dict, item: dict) -> dict:
    with log_context(run=trajectory.get("run_id"), trajectory=trajectory.get("id")):
        verdict = local_verifier().verify(TaskTemplate.from_json(template), Trajectory.from_json(trajectory),
                                          Item.from_json(item))
    return verdict_to_wire(verdict)


@shared_task(name="workers.tasks.read_task_upload", acks_late=True)
def read_task_upload(upload_id: str, key: str) -> None:
    """Read a large task file uploaded in the browser (apps/task_import/upload_jobs.py), on the `studio` queue."""
    from apps.task_import.upload_jobs import job_run

    job_run(upload_id, key)

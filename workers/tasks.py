"""Celery tasks: the only module under workers/ that touches Django.

Queues: `gpu` runs a run's attempt (the trainer and the inference engine, apps.runs.driver); `rollout` runs
tool calls in this worker's sandbox pool; `verify` runs verifications. A run's attempt sends its tool calls
and verifications to the other two queues when settings.REMOTE_ROLLOUTS is on (CeleryToolRunner,
CeleryVerifier below), so rollout and verification workers scale apart from the GPU ones.

`runs_watchdog` (Celery beat) queues again the runs whose worker stopped heartbeating; their next attempt
resumes from the last checkpoint. A train_run delivered twice (acks_late redelivery after a lost worker)
is harmless: the claim lets only one attempt through.
"""

from __future__ import annotations

import threading

from celery import shared_task
from celery.signals import worker_process_shutdown
from django.conf import settings

_pool = None
_pool_lock = threading.Lock()


def sandbox_pool():
    """This worker process's SandboxPool, made on first use."""
    global _pool
    with _pool_lock:
        if _pool is None:
            from workers.sandbox import SandboxPool
            from workers.sandbox.backends import backend_named

            _pool = SandboxPool(backend_named(settings.SANDBOX_BACKEND), status_dir=settings.SANDBOX_STATUS_DIR)
        return _pool


@worker_process_shutdown.connect
def _close_pool(**_):
    if _pool is not None:
        _pool.close()


@shared_task(name="workers.tasks.train_run", acks_late=True)
def train_run(run_id: str) -> str:
    from apps.runs.driver import run_attempt
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


def _image(data: dict):
    from workers.sandbox import Limits, SandboxImage

    return SandboxImage(key=data["key"], layers=tuple(data["layers"]), limits=Limits(**data["limits"]),
                        warm_pool_size=data["warm_pool_size"])


def _image_json(image) -> dict:
    from dataclasses import asdict

    return {"key": image.key, "layers": list(image.layers), "limits": asdict(image.limits),
            "warm_pool_size": image.warm_pool_size}


@shared_task(name="workers.tasks.execute_tool_call", acks_late=True)
def execute_tool_call(image: dict, name: str, arguments: dict, max_output_chars: int) -> dict:
    from workers.rl.tools import PolicyToolError, SandboxToolRunner

    try:
        result = SandboxToolRunner(sandbox_pool(), max_output_chars=max_output_chars).run(_image(image), name, arguments)
    except PolicyToolError as exc:
        return {"policy_error": str(exc)}
    return {**result.to_json(), "text": result.text}


@shared_task(name="workers.tasks.verify_trajectory", acks_late=True)
def verify_trajectory(template: dict, trajectory: dict, item: dict) -> dict:
    import base64

    from apps.runs.driver import _judge
    from workers.rl.pipeline import LocalVerifier
    from workers.rl.types import TaskTemplate, Trajectory
    from workers.verifiers import Item

    task_template = TaskTemplate(**{**template, "image": _image(template["image"]), "tools": tuple(template["tools"])})
    verdict = LocalVerifier(sandbox_pool(), _judge()).verify(task_template, Trajectory.from_json(trajectory),
                                                              Item(**item))
    data = verdict.to_json()
    data["artifacts"] = {name: base64.b64encode(blob).decode() for name, blob in verdict.artifacts.items()}
    return data


class CeleryToolRunner:
    """Tool calls on the `rollout` queue; the calling rollout thread waits for the result."""

    def __init__(self, *, max_output_chars: int, timeout: float = 600.0):
        self.max_output_chars, self.timeout = max_output_chars, timeout

    def run(self, image, name: str, arguments: dict, *, on_acquired=None):
        from workers.rl.tools import PolicyToolError, ToolResult, tool_execution

        tool_execution(name, arguments)  # a malformed call is the policy's error: refuse it before queueing
        if on_acquired is not None:
            on_acquired()  # waiting on a remote worker counts as the tool's time
        data = execute_tool_call.apply_async((_image_json(image), name, arguments, self.max_output_chars)).get(
            timeout=self.timeout, disable_sync_subtasks=False)
        if "policy_error" in data:
            raise PolicyToolError(data["policy_error"])
        return ToolResult(**data)


class CeleryVerifier:
    """Verifications on the `verify` queue."""

    def __init__(self, *, timeout: float = 900.0):
        self.timeout = timeout

    def verify(self, template, trajectory, item):
        import base64
        from dataclasses import asdict

        from workers.verifiers.types import Component, Verdict

        template_json = {**asdict(template), "image": _image_json(template.image), "tools": list(template.tools)}
        data = verify_trajectory.apply_async((template_json, trajectory.to_json(), asdict(item))).get(
            timeout=self.timeout, disable_sync_subtasks=False)
        artifacts = {name: base64.b64decode(blob) for name, blob in data.pop("artifacts").items()}
        components = [Component(**c) for c in data.pop("components")]
        return Verdict(**data, components=components, artifacts=artifacts)

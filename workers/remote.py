"""Tool calls and verifications on other workers: Celery tasks sent by name, so the engine never imports the
task module (workers/tasks.py, which is where Django starts).

A run's attempt uses these in place of the in-process SandboxToolRunner and LocalVerifier when the studio runs
on services with remote rollouts on (apps/common/wiring.py decides): the `rollout` and `verify` queues then scale
apart from the `gpu` workers. The calling rollout thread waits for each result.

The wire: what crosses the queue is JSON; bytes (a verdict's rendered artifacts) cross it as base64, and only
here — in a process, artifacts stay bytes.
"""

from __future__ import annotations

import base64

from celery.exceptions import TimeoutError as CeleryTimeout

from workers.rl.rollout.tools import PolicyToolError, tool_execution
from workers.rl.types import TaskTemplate, ToolResult, Trajectory
from workers.verifiers import Item, Verdict
from workers.verifiers.types import INFRA_ERROR

EXECUTE_TOOL_CALL = "workers.tasks.execute_tool_call"
VERIFY_TRAJECTORY = "workers.tasks.verify_trajectory"


def blobs_to_wire(blobs: dict[str, bytes]) -> dict[str, str]:
    return {name: base64.b64encode(blob).decode() for name, blob in blobs.items()}


def blobs_from_wire(data: dict[str, str]) -> dict[str, bytes]:
    return {name: base64.b64decode(text) for name, text in data.items()}


def tool_result_to_wire(result: ToolResult) -> dict:
    return {"result": result.to_json(), "text": result.text}


def tool_result_from_wire(data: dict) -> ToolResult:
    if "policy_error" in data:
        raise PolicyToolError(data["policy_error"])
    return ToolResult.from_json(data["result"], text=data["text"])


def verdict_to_wire(verdict: Verdict) -> dict:
    return {"verdict": verdict.to_json(), "artifacts": blobs_to_wire(verdict.artifacts)}


def verdict_from_wire(data: dict) -> Verdict:
    return Verdict.from_json(data["verdict"], artifacts=blobs_from_wire(data["artifacts"]))


def unanswered(queue: str, seconds: float) -> str:
    return (f"no worker answered on the {queue!r} queue within {seconds:g} s: is a Celery worker serving it "
            f"(celery -A studio worker -Q {queue})?")


class RemoteToolRunner:
    """Tool calls on the `rollout` queue (the task's route, set in the settings). A call no worker answers in
    `timeout` seconds is an infrastructure error of its trajectory, which says why: never a wait without end."""

    def __init__(self, app, *, max_output_chars: int, timeout: float):
        self.app, self.max_output_chars, self.timeout = app, max_output_chars, timeout

    def run(self, image, name: str, arguments: dict, *, on_acquired=None) -> ToolResult:
        tool_execution(name, arguments)  # a malformed call is the policy's error: refuse it before queueing
        if on_acquired is not None:
            on_acquired()  # waiting on a remote worker counts as the tool's time
        reply = self.app.send_task(EXECUTE_TOOL_CALL, (image.to_json(), name, arguments, self.max_output_chars))
        try:
            return tool_result_from_wire(reply.get(timeout=self.timeout, disable_sync_subtasks=False))
        except CeleryTimeout:
            reply.revoke()
            reason = unanswered("rollout", self.timeout)
            return ToolResult(status=INFRA_ERROR, text=reason, reason=reason)


class RemoteVerifier:
    """Verifications on the `verify` queue; one no worker answers in `timeout` seconds is ungraded (an
    infrastructure error, never a reward), and its verdict says why."""

    def __init__(self, app, *, timeout: float):
        self.app, self.timeout = app, timeout

    def verify(self, template: TaskTemplate, trajectory: Trajectory, item: Item) -> Verdict:
        reply = self.app.send_task(VERIFY_TRAJECTORY, (template.to_json(), trajectory.to_json(),
                                                       {"key": item.key, "inputs": item.inputs,
                                                        "hidden": item.hidden}))
        try:
            return verdict_from_wire(reply.get(timeout=self.timeout, disable_sync_subtasks=False))
        except CeleryTimeout:
            reply.revoke()
            return Verdict(reward=None, status=INFRA_ERROR, stopped_because=unanswered("verify", self.timeout))

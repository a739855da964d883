"""Tool calls and verifications on other workers: Celery tasks sent by name, so the engine never imports the
task module (workers/tasks.py, which is where Django starts).

A run's attempt uses these in place of the in-process SandboxToolRunner and LocalVerifier when the studio runs
on services with remote rollouts on (apps/common/wiring.py decides): the `rollout` and `verify` queues then scale
apart from the `gpu` workers. The calling rollout thread waits for each result.

Sessions across hosts: a template with a session holds one sandbox on one rollout worker for a whole trajectory.
Opening it is a task on the `rollout` queue like any call; its answer names the worker that holds the sandbox
and that worker's own queue (`sessions.<worker name>`, which every rollout worker also serves), and every later
call and the close go there (RemoteToolSession). While a call waits, the host is asked whether it is still there
(Celery's ping, at most every HOST_CHECK_SECONDS per host): a session whose host is gone ends its call as an
infrastructure error at once (the trajectory starts over elsewhere, and is never scored), rather than when the
call's own time runs out. Session calls need a rollout worker whose tasks run in its main process
(`-P threads` or `-P solo`): the sessions live in that process's memory.

The wire: what crosses the queue is JSON; bytes (a verdict's rendered artifacts) cross it as base64, and only
here — in a process, artifacts stay bytes.
"""

from __future__ import annotations

import base64
import threading
import time

from celery.exceptions import TimeoutError as CeleryTimeout

from workers.rl.rollout.tools import PolicyToolError, tool_execution
from workers.rl.types import TaskTemplate, ToolResult, Trajectory
from workers.sandbox.session import SessionLost
from workers.verifiers import Item, Verdict
from workers.verifiers.types import INFRA_ERROR

EXECUTE_TOOL_CALL = "workers.tasks.execute_tool_call"
VERIFY_TRAJECTORY = "workers.tasks.verify_trajectory"
OPEN_TOOL_SESSION = "workers.tasks.open_tool_session"
SESSION_TOOL_CALL = "workers.tasks.session_tool_call"
CLOSE_TOOL_SESSION = "workers.tasks.close_tool_session"
HOST_CHECK_SECONDS = 2.0  # how often a waiting session call asks whether its host is still there
SESSION_CALL_MARGIN = 60.0  # beyond the session's own call limit: the diff after a call, the queue


def session_queue(worker: str) -> str:
    """The queue of one rollout worker's sessions (`rollout@host` -> `sessions.rollout@host`)."""
    return f"sessions.{worker}"


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

    def __init__(self, app, *, max_output_chars: int, timeout: float, session_open_timeout: float = 600.0):
        self.app, self.max_output_chars, self.timeout = app, max_output_chars, timeout
        self.session_open_timeout = session_open_timeout
        self._hosts: dict[str, tuple[float, bool]] = {}  # worker -> (when asked, answered)
        self._hosts_lock = threading.Lock()

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


    def open_session(self, template: TaskTemplate, item: Item):
        """Opens the trajectory's session on whichever rollout worker takes the request; later calls go to that
        worker's own queue. Raises SessionLost when none answers or the worker could not open it."""
        reply = self.app.send_task(OPEN_TOOL_SESSION, (template.to_json(), item.to_json(), self.max_output_chars),
                                   queue="rollout")
        try:
            answer = reply.get(timeout=self.session_open_timeout, disable_sync_subtasks=False)
        except CeleryTimeout:
            reply.revoke()
            raise SessionLost(unanswered("rollout", self.session_open_timeout)) from None
        if "error" in answer:
            raise SessionLost(answer["error"])
        return RemoteToolSession(self, id=answer["session"], host=answer["host"], queue=answer["queue"],
                                 call_timeout=template.session.call_seconds + SESSION_CALL_MARGIN)

    def host_alive(self, host: str) -> bool:
        """Whether a worker answers Celery's ping; asked at most every HOST_CHECK_SECONDS per host, whoever asks."""
        with self._hosts_lock:
            checked, alive = self._hosts.get(host, (0.0, True))
            if time.monotonic() - checked < HOST_CHECK_SECONDS:
                return alive
        alive = bool(self.app.control.ping(destination=[host], timeout=1.0))
        with self._hosts_lock:
            self._hosts[host] = (time.monotonic(), alive)
        return alive


class RemoteToolSession:
    """A trajectory's session on another worker's host (sessions.ToolSession): calls go to that worker's queue."""

    def __init__(self, runner: RemoteToolRunner, *, id: str, host: str, queue: str, call_timeout: float):
        self.runner, self.id, self.host, self.queue, self.call_timeout = runner, id, host, queue, call_timeout
        self.closed = False

    def run(self, name: str, arguments: dict) -> ToolResult:
        started = time.monotonic()
        reply = self.runner.app.send_task(SESSION_TOOL_CALL, (self.id, name, arguments), queue=self.queue,
                                          expires=self.call_timeout)
        while True:
            try:
                data = reply.get(timeout=HOST_CHECK_SECONDS, disable_sync_subtasks=False)
                break
            except CeleryTimeout:
                waited = time.monotonic() - started
                if waited > self.call_timeout:
                    reason = f"the session's host {self.host} did not answer within {self.call_timeout:g} s"
                elif not self.runner.host_alive(self.host):
                    reason = f"the session's host {self.host} is gone"
                else:
                    continue
                reply.revoke()
                self.closed = True
                return ToolResult(status=INFRA_ERROR, text="", reason=reason, wall_seconds=waited)
        if "lost" in data:
            self.closed = True
            return ToolResult(status=INFRA_ERROR, text="", reason=data["lost"],
                              wall_seconds=time.monotonic() - started)
        return tool_result_from_wire(data)

    def close(self) -> None:
        """Tells the host to give the sandbox back (without waiting: a host that is gone has nothing to give)."""
        if not self.closed:
            self.closed = True
            self.runner.app.send_task(CLOSE_TOOL_SESSION, (self.id,), queue=self.queue, expires=600)


class RemoteVerifier:
    """Verifications on the `verify` queue; one no worker answers in `timeout` seconds is ungraded (an
    infrastructure error, never a reward), and its verdict says why."""

    def __init__(self, app, *, timeout: float):
        self.app, self.timeout = app, timeout

    def verify(self, template: TaskTemplate, trajectory: Trajectory, item: Item) -> Verdict:
        reply = self.app.send_task(VERIFY_TRAJECTORY, (template.to_json(), trajectory.to_json(), item.to_json()))
        try:
            return verdict_from_wire(reply.get(timeout=self.timeout, disable_sync_subtasks=False))
        except CeleryTimeout:
            reply.revoke()
            return Verdict(reward=None, status=INFRA_ERROR, stopped_because=unanswered("verify", self.timeout))

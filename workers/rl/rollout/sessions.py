"""A trajectory's tool calls, in a fresh sandbox each or in one sandbox session held for the whole trajectory.

A template that declares `session:` (workers/definitions/specs.py) gets a session (workers/sandbox/session.py):
opened at its trajectory's first tool call, or before its first turn when the session has `prepare` commands,
and closed when the trajectory ends, whichever way it ends (TrajectoryTools.close, called from a `finally`).
Its workspace starts from the task's repository snapshot (`inputs["repository"]`) when it has one, else from the
image's files. Which tools run in it:
- the software-engineering tool set (swe_tools.SweToolSet: bash, str_replace_editor, run_tests, submit) when the
  template offers some of those and no other;
- otherwise the built-in tools (tools.py), each one process in the workspace: run_python's files persist.

How a session's troubles reach the trajectory (agent.py records them):
- the sandbox died, its host is gone, it could not be opened: a ToolResult with status `infra_error` (the
  trajectory is an infrastructure error: retried, never scored);
- the session's own budget is spent (max_calls, lifetime): status `limit`, its reason naming the limit (the
  trajectory ends there and is verified as it stands).
"""

from __future__ import annotations

import base64
import hashlib
import time

from workers.sandbox.session import Session, SessionLimitReached, SessionLost, WorkspaceSource
from workers.verifiers import Item

from ..types import TaskTemplate, ToolResult
from .tools import result_text, tool_execution

LIMIT = "limit"  # a ToolResult status: the session's budget is spent (reason: "calls" or "lifetime")
INFRA_ERROR = "infra_error"


def workspace_for(item: Item) -> WorkspaceSource | None:
    """The task's own workspace: its repository snapshot ({"data": base64 tar.gz, "sha256": ...}, as repository
    tasks store it), or None for the image's files alone. A snapshot whose bytes do not match its sha256 is
    refused (ValueError): the prepared-workspace cache is keyed by that hash."""
    snapshot = item.inputs.get("repository") if isinstance(item.inputs, dict) else None
    if not isinstance(snapshot, dict) or not isinstance(snapshot.get("data"), str):
        return None
    data = base64.b64decode(snapshot["data"])
    digest = hashlib.sha256(data).hexdigest()
    if snapshot.get("sha256") not in (None, digest):
        raise ValueError("the task's repository snapshot does not match its sha256")
    return WorkspaceSource.from_bytes(data, digest)


class BuiltinSessionTools:
    """The built-in tools (tools.py) run in a session: each call one `python3` process in the workspace, so what
    run_python writes stays for the next call."""

    def __init__(self, session: Session, *, max_output_chars: int):
        self.session, self.max_output_chars = session, max_output_chars

    def call(self, name: str, arguments: dict) -> ToolResult:
        execution = tool_execution(name, arguments)
        result = self.session.exec(["python3", "-c", execution.program], stdin=execution.stdin)
        return ToolResult(status=str(result.status), text=result_text(name, result, self.max_output_chars),
                          exit_code=result.exit_code, stdout=result.stdout.decode("utf-8", "replace")[-4000:],
                          stderr=result.stderr.decode("utf-8", "replace")[-4000:], wall_seconds=result.wall_seconds,
                          cpu_seconds=result.cpu_seconds, reason=result.reason)


def session_tool_set(template: TaskTemplate, session: Session, *, max_output_chars: int):
    """The tool set a template's session runs: the software-engineering one for a template that offers exactly
    its tools, the built-in tools otherwise. Either has `call(name, arguments) -> ToolResult`."""
    from .swe_tools import SweToolSet, editor_commands, offers_swe_tools

    if offers_swe_tools(template.tools):
        return SweToolSet(session, editor_commands=editor_commands(template.tools))
    return BuiltinSessionTools(session, max_output_chars=max_output_chars)


def open_local_session(runner, template: TaskTemplate, item: Item) -> LocalToolSession:
    """The template's session for one trajectory in the pool of `runner` (a SandboxToolRunner: this process's)."""
    session = runner.pool.open_session(template.image, template.session, workspace=workspace_for(item),
                                       timeout=runner.session_open_timeout)
    return LocalToolSession(session, session_tool_set(template, session, max_output_chars=runner.max_output_chars))


class LocalToolSession:
    """A session in this process's sandbox pool (protocols.ToolSession)."""

    host = "local"

    def __init__(self, session: Session, tools):
        self.session, self.tools = session, tools
        self.id = session.id

    def run(self, name: str, arguments: dict) -> ToolResult:
        started = time.monotonic()
        try:
            return self.tools.call(name, arguments)
        except SessionLost as exc:
            return ToolResult(status=INFRA_ERROR, text="", reason=f"the session was lost: {exc}",
                              wall_seconds=time.monotonic() - started)
        except SessionLimitReached as exc:
            return ToolResult(status=LIMIT, text=str(exc), reason=exc.limit, wall_seconds=time.monotonic() - started)

    def close(self) -> None:
        self.session.close()


class TrajectoryTools:
    """The tool calls of one trajectory: each in a fresh sandbox (a template without a session), or all in the
    trajectory's session, opened on the first call (or by `open`) and given back by `close`."""

    def __init__(self, runner, template: TaskTemplate, item: Item):
        self.runner, self.template, self.item = runner, template, item
        self.session = None  # protocols.ToolSession, once opened
        self.open_failure: ToolResult | None = None
        self.open_seconds = 0.0

    @property
    def stateful(self) -> bool:
        return self.template.session is not None

    def open(self) -> ToolResult | None:
        """Opens the session now (a template whose session has prepare commands opens it before the first turn);
        an infra_error ToolResult when it cannot be opened, None otherwise. Idempotent."""
        if self.session is not None or self.open_failure is not None or not self.stateful:
            return self.open_failure
        started = time.monotonic()
        try:
            # A runner that opens sessions elsewhere (workers/remote.py) says how; this process's, from its pool.
            opener = getattr(self.runner, "open_session", None)
            self.session = opener(self.template, self.item) if opener else \
                open_local_session(self.runner, self.template, self.item)
        except Exception as exc:  # the pool, the image, the host: never the policy's doing
            self.open_failure = ToolResult(status=INFRA_ERROR, text="", reason=f"the session could not be opened: "
                                                                                f"{type(exc).__name__}: {exc}")
        self.open_seconds = time.monotonic() - started
        return self.open_failure

    def run(self, name: str, arguments: dict, *, on_acquired=None) -> ToolResult:
        if not self.stateful:
            return self.runner.run(self.template.image, name, arguments, on_acquired=on_acquired)
        first = self.session is None and self.open_failure is None
        failure = self.open()
        if failure is not None:
            return failure
        if on_acquired is not None:
            on_acquired()
        result = self.session.run(name, arguments)
        if first:  # opening the session was this call's wait for a sandbox
            result.assembly_seconds += self.open_seconds
        return result

    def close(self) -> None:
        if self.session is not None:
            try:
                self.session.close()
            except Exception:  # a session whose host is gone: nothing left to give back
                pass

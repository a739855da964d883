"""The software-engineering tool set, in the shapes the field uses: `bash`, `str_replace_editor`, `run_tests` and
`submit`.

- bash(command, timeout): one `bash -c` in the repository (/sandbox/repo), a new process each call as in
  mini-swe-agent: files persist in the session's workspace, the shell's state does not. Output past the per-call
  limit keeps its head and its tail around a marker saying how much was elided.
- str_replace_editor(command, path, ...): SWE-agent's and OpenHands' editor: `view` (a file with line numbers, a
  `view_range`, or a directory two levels deep), `create` (never overwrites), `str_replace` (old_str must occur
  exactly once), `insert` (after `insert_line`, 0 for the top) and `undo_edit` (the file's last edit).
- run_tests(): pytest on the workspace's test files, its report cut short (swe_programs.RUN_TESTS: a line per failing
  test with its assertion's message, pytest's closing line); the result's exit code is pytest's. The repair tool
  set (REPAIR_TOOLS) offers it with an editor that only views and replaces, schemas short enough for a small
  model's system prompt.
- submit(): ends the trajectory; its diff is what verification replays on the base in a fresh sandbox.

Every call is one process in the trajectory's session (its workspace is the repository) and is followed by the
workspace's diff against the base, which the tool turn records where it changed (None: as the step before left
it). The tool set keeps two budgets apart: characters per call (the truncation above) and characters per
trajectory (past it, a call still runs, and its result says only that the trajectory's output budget is spent).
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass

from workers.definitions.specs import ToolSpec
from workers.sandbox import Status

from ..types import ToolResult
from .swe_programs import BASH, EDITOR, RUN_TESTS
from .tools import PolicyToolError

BASH_TOOL = {"name": "bash",
             "description": "Run a bash command in the repository (a new shell each call; files persist). "
                            "Long output is cut in the middle.",
             "parameters": {"type": "object", "properties": {
                 "command": {"type": "string"}, "timeout": {"type": "number", "description": "seconds"}},
                 "required": ["command"]}}
EDITOR_TOOL = {"name": "str_replace_editor",
               "description": "View, create and edit files: view (view_range [first, last]), create (file_text), "
                              "str_replace (old_str must match exactly once, new_str), insert (insert_line, "
                              "new_str), undo_edit.",
               "parameters": {"type": "object", "properties": {
                   "command": {"type": "string", "enum": ["view", "create", "str_replace", "insert", "undo_edit"]},
                   "path": {"type": "string"}, "file_text": {"type": "string"}, "old_str": {"type": "string"},
                   "new_str": {"type": "string"}, "insert_line": {"type": "integer"},
                   "view_range": {"type": "array", "items": {"type": "integer"}}},
                   "required": ["command", "path"]}}
SUBMIT_TOOL = {"name": "submit", "description": "Submit the repository's current state as the fix.",
               "parameters": {"type": "object", "properties": {}}}
RUN_TESTS_TOOL = {"name": "run_tests", "description": "Run the repository's tests; shows each failing test and "
                                                  "the summary.", "parameters": {"type": "object", "properties": {}}}
REPAIR_EDITOR_TOOL = {"name": "str_replace_editor",
                      "description": "view a file (view_range [first, last]) or str_replace: old_str, which must "
                                     "match exactly once, becomes new_str.",
                      "parameters": {"type": "object", "properties": {
                          "command": {"type": "string", "enum": ["view", "str_replace"]}, "path": {"type": "string"},
                          "old_str": {"type": "string"}, "new_str": {"type": "string"},
                          "view_range": {"type": "array", "items": {"type": "integer"}}},
                          "required": ["command", "path"]}}
SWE_TOOLS = (BASH_TOOL, EDITOR_TOOL, SUBMIT_TOOL)
REPAIR_TOOLS = (RUN_TESTS_TOOL, REPAIR_EDITOR_TOOL, SUBMIT_TOOL)
SWE_TOOL_NAMES = ("bash", "str_replace_editor", "run_tests", "submit")  # what a session's SWE tool set runs
EDITOR_COMMANDS = ("view", "create", "str_replace", "insert", "undo_edit")
MAX_DIFF_BYTES = 1024 * 1024  # a diff past this is recorded cut, and so no longer applies: the model's own doing


def editor_commands(tools: Sequence[ToolSpec]) -> tuple[str, ...]:
    """The editor commands a template's str_replace_editor schema offers (every one when it names none)."""
    editor = next((tool for tool in tools if tool.name == "str_replace_editor"), None)
    offered = ((editor.parameters.get("properties") or {}).get("command") or {}).get("enum") if editor else None
    return tuple(c for c in EDITOR_COMMANDS if c in offered) if offered else EDITOR_COMMANDS


def offers_swe_tools(tools: Sequence[ToolSpec]) -> bool:
    """Whether a template offers the software-engineering tool set (some of its tools, and no other): with a
    session, those run (sessions.session_tool_set) instead of the built-in tools."""
    names = {tool.name for tool in tools}
    return bool(names) and names <= set(SWE_TOOL_NAMES)


@dataclass(frozen=True)
class SweLimits:
    call_output_chars: int = 10_000  # mini-swe-agent's default cut
    trajectory_output_chars: int = 200_000
    default_timeout: float = 30.0
    max_timeout: float = 120.0
    tests_timeout: float = 30.0  # run_tests: a mutation can loop forever
    failures_shown: int = 3  # run_tests: failing tests listed; the rest counted
    failure_line_chars: int = 300  # run_tests: a failing test's line past this is cut


def clipped(text: str, limit: int) -> str:
    """`text` cut to its head and tail around a marker when longer than `limit` (the bash program does the same
    in the sandbox, where it still has the whole output)."""
    if len(text) <= limit:
        return text
    half = limit // 2
    return (f"{text[:half]}\n[... {len(text) - 2 * half} characters of output elided; the first and last {half} "
            f"are shown ...]\n{text[-half:]}")


class SweToolSet:
    """The tools of one trajectory over its session: `call(name, arguments)` runs one tool and returns its result
    with the workspace's diff after it. `session` is the trajectory's sandbox session (workers/sandbox/session.py),
    its workspace the repository (workers.verifiers.repository.snapshot_workspace). `editor_commands`: the editor's
    commands the template offers (its schema's enum); another is refused as a call the schema does not allow."""

    def __init__(self, session, *, limits: SweLimits = SweLimits(), editor_commands: Sequence[str] = EDITOR_COMMANDS):
        self.session = session
        self.limits = limits
        self.editor_commands = tuple(editor_commands)
        self.output_used = 0
        self.calls = 0
        self.submitted = False
        self.diff = ""

    def call(self, name: str, arguments: dict) -> ToolResult:
        started = time.monotonic()
        self.calls += 1
        if name == "submit":
            result = None
            text = "Submitted. The diff against the base is verified in a fresh sandbox."
            self.submitted = True
        else:
            program, request, timeout = self._program(name, arguments)
            result = self.session.exec(["python3", "-c", program], timeout=timeout, cwd=".",
                                       stdin=json.dumps(request).encode())
            if result.status == Status.INFRA_ERROR:
                return ToolResult(status="infra_error", text="", reason=result.reason,
                                  wall_seconds=time.monotonic() - started)
            text = result.stdout.decode("utf-8", "replace")
            if name == "bash":
                text = f"exit code {result.exit_code}\n{text}" if result.status in (Status.OK, Status.ERROR) else \
                    f"{text}\n[the command was stopped: {result.reason}]"
            else:
                text = clipped(text, self.limits.call_output_chars)
        text = self._budgeted(text)
        before = self.diff
        diff = self.workspace_diff()
        # Recorded where it changed (and at submit): a trajectory of forty views stores its diff once, and the
        # last one recorded is the workspace's (Trajectory.workspace_diff).
        recorded = diff if diff != before or name == "submit" or self.calls == 1 else None
        return ToolResult(status=str(result.status) if result else "ok", text=text,
                          exit_code=result.exit_code if result else 0,
                          stdout=result.stdout.decode("utf-8", "replace")[-4000:] if result else "",
                          stderr=result.stderr.decode("utf-8", "replace")[-4000:] if result else "",
                          wall_seconds=time.monotonic() - started,
                          cpu_seconds=result.cpu_seconds if result else 0.0, reason=result.reason if result else "",
                          workspace_diff=recorded)

    def workspace_diff(self) -> str:
        """The workspace's diff against the base. One longer than MAX_DIFF_BYTES is recorded cut (it no longer
        applies, and so fixes nothing: the model's own doing)."""
        try:
            self.diff = self.session.diff(limit=MAX_DIFF_BYTES)
        except ValueError:
            self.diff = f"[the workspace's diff is longer than {MAX_DIFF_BYTES} bytes]"
        return self.diff

    def _budgeted(self, text: str) -> str:
        room = self.limits.trajectory_output_chars - self.output_used
        if room <= 0:
            return "[the trajectory's tool output budget is spent: this result is not shown]"
        if len(text) > room:
            text = text[:room] + "\n[the trajectory's tool output budget ends here]"
        self.output_used += len(text)
        return text

    def _program(self, name: str, arguments: dict) -> tuple[str, dict, float]:
        if name == "bash":
            command = arguments.get("command")
            if not isinstance(command, str) or not command.strip():
                raise PolicyToolError("bash needs a command")
            timeout = arguments.get("timeout", self.limits.default_timeout)
            if not isinstance(timeout, int | float) or isinstance(timeout, bool) or timeout <= 0:
                raise PolicyToolError("bash's timeout is a number of seconds")
            timeout = min(float(timeout), self.limits.max_timeout)
            # The sandbox's own limit comes a little after the command's, so the program reports the timeout.
            return BASH, {"command": command, "timeout": timeout, "limit": self.limits.call_output_chars}, timeout + 5
        if name == "str_replace_editor":
            command, path = arguments.get("command"), arguments.get("path")
            if command not in self.editor_commands:
                raise PolicyToolError(f"str_replace_editor's command is one of {', '.join(self.editor_commands)}")
            if not isinstance(path, str) or not path:
                raise PolicyToolError("str_replace_editor needs a path")
            for key, kind in (("file_text", str), ("old_str", str), ("new_str", str), ("insert_line", int)):
                if key in arguments and not isinstance(arguments[key], kind):
                    raise PolicyToolError(f"str_replace_editor's {key} must be a {kind.__name__}")
            needed = {"create": ("file_text",), "str_replace": ("old_str",), "insert": ("insert_line", "new_str")}
            missing = [key for key in needed.get(command, ()) if key not in arguments]
            if missing:
                raise PolicyToolError(f"str_replace_editor {command} needs {', '.join(missing)}")
            view_range = arguments.get("view_range")
            if view_range is not None and not (isinstance(view_range, list) and len(view_range) == 2 and all(
                    isinstance(n, int) and not isinstance(n, bool) for n in view_range)):
                raise PolicyToolError("view_range is [first line, last line] (-1 for the end)")
            return EDITOR, {**arguments, "limit": self.limits.call_output_chars}, 30.0
        if name == "run_tests":
            return RUN_TESTS, {"timeout": self.limits.tests_timeout, "failures_shown": self.limits.failures_shown,
                               "line_chars": self.limits.failure_line_chars}, self.limits.tests_timeout + 5
        raise PolicyToolError(f"{name!r} is not a tool of this task; it offers {', '.join(SWE_TOOL_NAMES)}")



"""The tools a task template offers the policy, and how a call of one runs in the sandbox pool.

The policy calls a tool by writing `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` (the Hermes /
Qwen convention most open chat templates use). Each call runs as one program in a fresh, warm sandbox of the
template's image (SandboxPool.execute: reset after use, infrastructure errors retried): calls are stateless,
and the conversation carries what the policy learned from earlier ones — unless the template declares a
session, whose calls all run in one sandbox held for the trajectory (sessions.py). The built-in tools:

- run_python(code): the code runs as the sandbox's main.py; the result is its exit code, stdout and stderr.
- read_document(doc_id): the text of docs/<doc_id>.txt in the image.
- search_documents(query): the sentences of docs/*.txt that contain the query (case-insensitive).

Arguments are checked on the host before anything runs; a call that names no known tool, is not JSON, or
lacks a required argument is the policy's error, never the sandbox's.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass

from workers.definitions.specs import ToolSpec
from workers.sandbox import Execution, Status

from ..types import TOOL_CALL, ToolResult

# The spec of the built-in run_python tool, as a task template's spec offers it: the demo's templates and the
# tests offer this one.
RUN_PYTHON_TOOL = {"name": "run_python",
                   "description": "Run a Python script in the sandbox; returns the exit code, stdout, stderr and the "
                                  "files it wrote.",
                   "parameters": {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]}}

DOC_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")

_READ_DOCUMENT = """
import json, pathlib, sys
doc_id = json.load(sys.stdin)["doc_id"]
path = pathlib.Path("docs") / (doc_id + ".txt")
print(path.read_text() if path.is_file() else f"no document {doc_id!r}; documents: " +
      ", ".join(sorted(p.stem for p in pathlib.Path("docs").glob("*.txt"))))
"""

_SEARCH_DOCUMENTS = """
import json, pathlib, re, sys
query = json.load(sys.stdin)["query"].strip().lower()
hits = []
for path in sorted(pathlib.Path("docs").glob("*.txt")):
    for sentence in re.split(r"(?<=[.!?])\\s+|\\n+", path.read_text()):
        if query and query in sentence.lower():
            hits.append(f"{path.stem}: {sentence.strip()}")
print("\\n".join(hits[:20]) if hits else f"no sentence contains {query!r}")
"""


class PolicyToolError(ValueError):
    """The policy's call is malformed: unknown tool, not JSON, wrong arguments."""


@dataclass
class ParsedCall:
    name: str
    arguments: dict


def parse_tool_calls(text: str, tools: Sequence[ToolSpec]) -> list[ParsedCall]:
    """The calls in an assistant message; raises PolicyToolError for a malformed one."""
    known = {tool.name: tool for tool in tools}
    calls = []
    for block in TOOL_CALL.findall(text):
        try:
            data = json.loads(block)
        except ValueError as exc:
            raise PolicyToolError(f"tool call is not JSON: {exc}") from None
        if not isinstance(data, dict) or not isinstance(data.get("name"), str):
            raise PolicyToolError('a tool call needs {"name": ..., "arguments": {...}}')
        calls.append(checked_call(data["name"], data.get("arguments", {}), known))
    return calls


def checked_call(name: str, arguments, known: dict[str, ToolSpec]) -> ParsedCall:
    """A call already split into its name and arguments (parsed from the policy's text, or sent by a trainer
    elsewhere: workers/environments), checked against the tools on offer; raises PolicyToolError for an unknown
    tool, arguments that are not an object, or a required argument missing."""
    if name not in known:
        raise PolicyToolError(f"unknown tool {name!r}; this task offers {', '.join(known) or 'none'}")
    if not isinstance(arguments, dict):
        raise PolicyToolError("tool call arguments must be a JSON object")
    required = known[name].parameters.get("required", [])
    missing = [argument for argument in required if argument not in arguments]
    if missing:
        raise PolicyToolError(f"{name} needs {', '.join(missing)}")
    return ParsedCall(name, arguments)


def tool_execution(name: str, arguments: dict) -> Execution:
    """The sandbox program for a built-in tool call."""
    if name == "run_python":
        code = arguments.get("code")
        if not isinstance(code, str):
            raise PolicyToolError("run_python needs code as a string")
        return Execution(program=code)
    if name == "read_document":
        doc_id = arguments.get("doc_id")
        if not isinstance(doc_id, str) or not DOC_ID.match(doc_id):
            raise PolicyToolError("read_document needs a doc_id such as report-001")
        return Execution(program=_READ_DOCUMENT, stdin=json.dumps({"doc_id": doc_id}).encode())
    if name == "search_documents":
        query = arguments.get("query")
        if not isinstance(query, str) or not query.strip():
            raise PolicyToolError("search_documents needs a non-empty query")
        return Execution(program=_SEARCH_DOCUMENTS, stdin=json.dumps({"query": query[:200]}).encode())
    raise PolicyToolError(f"{name!r} has no implementation; built-in tools: {', '.join(BUILTIN_TOOLS)}")


BUILTIN_TOOLS = ("run_python", "read_document", "search_documents")


def unknown_tools(tools: Sequence[ToolSpec]) -> list[str]:
    """Tool names a template declares that no built-in implements (checked before a run starts; a template with a
    session may offer the software-engineering tool set instead: swe_tools.offers_swe_tools)."""
    return [tool.name for tool in tools if tool.name not in BUILTIN_TOOLS]


def result_text(name: str, result, limit: int) -> str:
    stdout = result.stdout.decode("utf-8", "replace")
    stderr = result.stderr.decode("utf-8", "replace")
    if name != "run_python" and result.status == Status.OK:
        text = stdout
    else:
        text = f"exit code {result.exit_code}" + (f" ({result.status}: {result.reason})" if result.status not in (
            Status.OK, Status.ERROR) else "") + f"\nstdout:\n{stdout}" + (f"\nstderr:\n{stderr}" if stderr else "")
    if len(text) > limit:
        text = text[:limit] + f"\n[... {len(text) - limit} more characters cut]"
    return text


class SandboxToolRunner:
    """Runs tool calls in a local SandboxPool (the embedded studio, and every rollout worker)."""

    def __init__(self, pool, *, acquire_timeout: float = 60.0, max_output_chars: int = 2000,
                 session_open_timeout: float = 600.0):
        """session_open_timeout: how long opening a session in this pool may wait (sessions.open_local_session),
        the first one of a workspace included (it waits for the workspace's preparation, paid once per image)."""
        self.pool = pool
        self.acquire_timeout = acquire_timeout
        self.max_output_chars = max_output_chars
        self.session_open_timeout = session_open_timeout

    def run(self, image, name: str, arguments: dict, *, on_acquired=None) -> ToolResult:
        execution = tool_execution(name, arguments)
        started = time.monotonic()
        acquired_at = []

        def acquired():
            acquired_at.append(time.monotonic())
            if on_acquired is not None:
                on_acquired()

        result = self.pool.execute(image, execution, timeout=self.acquire_timeout, on_acquired=acquired)
        assembly = (acquired_at[-1] if acquired_at else time.monotonic()) - started
        return ToolResult(status=str(result.status), text=result_text(name, result, self.max_output_chars),
                          exit_code=result.exit_code, stdout=result.stdout.decode("utf-8", "replace")[-4000:],
                          stderr=result.stderr.decode("utf-8", "replace")[-4000:], wall_seconds=result.wall_seconds,
                          cpu_seconds=result.cpu_seconds, assembly_seconds=assembly, attempts=result.attempts,
                          reason=result.reason, files=sorted(result.files))

"""The repair domain's expert trajectories replayed without a sandbox: `bench engine` and `bench serve`'s repository
workload (issue 45; `manage.py bench` hands it to them, since the engine's benchmarks import nothing of the studio).
The conversations of the expert trajectories (repair.py, the demo's gold replays: workers/rl/models/base_model.py
`repair_reference_turns`), each cut before one of the expert's turns — run the tests, view the file, replace the
lines it viewed, run the tests again, submit — so the model answers with the system prompt, the tools' schemas, the
buggy function and the tools' results so far in its context, as a rollout's later turns do. A `str_replace` copies
back lines the model has just viewed: what speculative decoding from the context (workers/rl/engines/speculation.py)
is for.

The tools' results are what the sandbox would answer, computed here without one: the tool programs the sandbox runs
(workers/rl/rollout/swe_programs.py: the editor, pytest's cut report) run by this interpreter in a temporary copy
of the task's repository. The tasks are the first `tasks` by key, the same on every machine.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

from . import repair

SUBMITTED = "Submitted. The diff against the base is verified in a fresh sandbox."


def _tool_result(name: str, arguments: dict, workspace: Path) -> str:
    from workers.rl.rollout.swe_programs import EDITOR, RUN_TESTS
    from workers.rl.rollout.swe_tools import SweLimits, clipped

    limits = SweLimits()
    if name == "submit":
        return SUBMITTED
    if name == "run_tests":
        program, request = RUN_TESTS, {"timeout": limits.tests_timeout, "failures_shown": limits.failures_shown,
                                       "line_chars": limits.failure_line_chars}
    else:
        program, request = EDITOR, {**arguments, "limit": limits.call_output_chars}
    done = subprocess.run([sys.executable, "-c", program], input=json.dumps(request).encode(), cwd=workspace,
                          capture_output=True, timeout=120, check=False)
    # The temporary directory's name is no part of the answer (a sandbox names its workspace alike every time).
    text = done.stdout.decode("utf-8", "replace").replace(str(workspace), "/workspace")
    return clipped(text, limits.call_output_chars)


def conversations(tasks: int = 4) -> list[tuple[list[dict], list[dict]]]:
    """(messages, tools) per cut of the first `tasks` repair tasks' expert trajectories: the messages before each
    of the expert's turns after the first."""
    from workers.rl.models.base_model import repair_reference_turns
    from workers.verifiers.repository import snapshot_contents

    chosen = sorted(repair.instances(), key=lambda task: task["key"])[:tasks]
    tools = [dict(tool) for tool in repair.REPAIR_TOOLS]
    cuts = []
    for task in chosen:
        messages = [{"role": "system", "content": repair.SYSTEM_PROMPT},
                    {"role": "user", "content": repair.PROMPT.format(**task["inputs"])}]
        turns = repair_reference_turns(task["inputs"], task["hidden"]) or []
        with tempfile.TemporaryDirectory(prefix="bench-repository-") as directory:
            workspace = Path(directory)
            for path, content in snapshot_contents(task["inputs"]["repository"]).items():
                (workspace / path).parent.mkdir(parents=True, exist_ok=True)
                (workspace / path).write_bytes(content)
            for index, turn in enumerate(turns):
                if index:
                    cuts.append((list(messages), tools))
                call = json.loads(turn["content"].removeprefix("<tool_call>").removesuffix("</tool_call>"))
                messages += [turn, {"role": "tool", "content": _tool_result(call["name"], call["arguments"],
                                                                            workspace)}]
    return cuts

"""Planted repair trajectories: a model's tool calls (run_tests, bash, str_replace_editor, submit) one per turn, each
answered by a tool turn built with the engine's own types, as a repair task's rollout records them."""

from workers.rl.types import ToolCall, ToolResult, Trajectory, Turn
from workers.verifiers import Verdict

FAILING = "test_solution.py::test_add[small] add(1, 2) returned -1, expected 3\n1 failed, 2 passed in 0.03s"
PASSING = "3 passed in 0.02s"
FIX = "--- a/solution.py\n+++ b/solution.py\n@@ -1,2 +1,2 @@\n def add(a, b):\n-    return a - b\n+    return a + b\n"


def run_tests(exit_code: int) -> tuple:
    return ("run_tests", {}, ToolResult(status="ok" if exit_code == 0 else "error", text="", exit_code=exit_code),
            FAILING if exit_code else PASSING)


def bash(command: str, output: str, *, exit_code: int = 0, diff: str | None = None) -> tuple:
    return ("bash", {"command": command}, ToolResult(status="ok", text="", exit_code=exit_code, workspace_diff=diff),
            f"exit code {exit_code}\n{output}")


def editor(command: str, *, exit_code: int = 0, diff: str | None = None) -> tuple:
    arguments = {"command": command, "path": "solution.py", "old_str": "a - b", "new_str": "a + b"}
    return ("str_replace_editor", arguments,
            ToolResult(status="ok" if exit_code == 0 else "error", text="", exit_code=exit_code, workspace_diff=diff),
            "Edited solution.py" if exit_code == 0 else "old_str did not appear verbatim in solution.py")


def submit() -> tuple:
    return ("submit", {}, ToolResult(status="ok", text="", exit_code=0), "Submitted.")


def planted(*calls: tuple, reward: float | None = 1.0, said: str = "", id: str = "t", run_id: str = "r",
            seq: int = 0, step: int = 1) -> Trajectory:
    """A trajectory whose model makes `calls` (name, arguments, result, what the tool printed), each answered by a
    tool turn; `said` is what the model writes in its last message."""
    turns = [Turn(role="system", content="Fix the bug."), Turn(role="user", content="solution.py: def add")]
    for index, (name, arguments, result, output) in enumerate(calls):
        call = ToolCall(id=f"call-{index}", name=name, arguments=dict(arguments))
        turns.append(Turn(role="assistant", content="", tool_calls=[call]))
        turns.append(Turn(role="tool", content=output, tool_call_id=call.id, name=name,
                          result=ToolResult(**{**vars(result), "text": output})))
    if said:
        turns.append(Turn(role="assistant", content=said))
    verdict = None if reward is None else Verdict(reward=reward, status="pass" if reward == 1 else "fail",
                                                  layers_run=["repository"])
    return Trajectory(id=id, run_id=run_id, seq=seq, sample=0, domain="python-repair", template="function-repair",
                      task_key=f"repair-{seq:05d}", task_hash="0" * 64, image="i", verifier="v", policy_version=0,
                      step=step, turns=turns, reward=reward, verdict=verdict, started_at=1_700_000_000.0,
                      finished_at=1_700_000_001.0)

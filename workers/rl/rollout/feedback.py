"""Did the model use test feedback? A repair trajectory read from its tool results alone.

A trajectory's repair events, in turn order:
- a test run: a `run_tests` call (its exit code is pytest's: 0 all passed, anything else failed), or a `bash` call
  whose command runs pytest (read from pytest's summary line in its output: a pipe such as `| tail -5` hides the
  exit code);
- an edit: a `str_replace_editor` str_replace / insert / create / undo_edit that succeeded, or any tool call after
  which the workspace's diff changed (`sed -i` in bash, say).

`repair_outcome` classifies a graded trajectory: "fixed_by_feedback" (solved, and a test run failed, an edit came
after it, and a later test run passed), "guessed" (solved otherwise), "gave_up" (not solved), None (no test run and
no edit: not a repair trajectory; or not graded). The model's own messages never count, only what the tools gave
back: a model that writes "1 passed" has run nothing. A bash command's output is what the command printed, so a
command that echoes a summary line is read as one; run_tests's exit code is the account to trust.

`repair_points` is the run metric `repair/fixed_after_feedback`: fixed_by_feedback over solved, over a step's
trajectories (or an evaluation's), emitted only where some repair trajectory was solved.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from ..types import Trajectory, Turn

FIXED_BY_FEEDBACK, GUESSED, GAVE_UP = "fixed_by_feedback", "guessed", "gave_up"
OUTCOMES = (FIXED_BY_FEEDBACK, GUESSED, GAVE_UP)
FIXED_AFTER_FEEDBACK = "repair/fixed_after_feedback"

EDIT_COMMANDS = ("str_replace", "insert", "create", "undo_edit")  # the editor's commands that write
RUNS_PYTEST = re.compile(r"\bpy\.?test\b")  # `pytest`, `python -m pytest`, `py.test`
# pytest's last line: "==== 2 failed, 3 passed in 0.12s ====", with -q "1 passed in 0.01s", "no tests ran in 0.01s";
# a run past a minute adds "(0:01:05)".
SUMMARY_LINE = re.compile(r"^=*\s*(?P<counts>(?:\d+ [a-z]+(?:, )?)+|no tests ran) in [\d.]+s(?: \([\d:]+\))?\s*=*$",
                          re.MULTILINE)
COUNT = re.compile(r"(\d+) ([a-z]+)")


@dataclass(frozen=True)
class RepairEvent:
    turn: int  # the tool turn's index in trajectory.turns
    kind: Literal["test", "edit"]
    tool: str  # the tool that ran: run_tests, bash, str_replace_editor
    output: str = ""  # a test run: what it printed (the tool turn's content)
    passed: bool | None = None  # a test run: whether every test passed
    diff: str = ""  # an edit: the workspace's diff against the base after it


@dataclass(frozen=True)
class Repair:
    """A trajectory's repair events, the fix chain in them (the failing run, the edit after it and the passing run
    after that; None without one) and its outcome."""

    events: tuple[RepairEvent, ...]
    chain: tuple[RepairEvent, RepairEvent, RepairEvent] | None
    outcome: str | None


def pytest_passed(output: str) -> bool | None:
    """Whether pytest's last summary line in `output` says every test passed (None: no summary line, or no test
    ran). Errors (a collection error, a broken fixture) fail the run as failures do."""
    lines = list(SUMMARY_LINE.finditer(output))
    if not lines:
        return None
    counts = {word.rstrip("s") if word.startswith("error") else word: int(n)
              for n, word in COUNT.findall(lines[-1].group("counts"))}
    if counts.get("failed", 0) or counts.get("error", 0):
        return False
    return True if counts.get("passed", 0) else None


def repair_events(turns: list[Turn]) -> list[RepairEvent]:
    """The test runs and edits among `turns`, in order. A tool call that both edits and tests (`sed -i ... &&
    pytest`) gives its edit first, as the command ran them."""
    calls = {call.id: call for turn in turns if turn.role == "assistant" for call in turn.tool_calls}
    events: list[RepairEvent] = []
    diff = ""  # the workspace starts as the base
    for index, turn in enumerate(turns):
        result = turn.result
        if turn.role != "tool" or result is None:
            continue
        call = calls.get(turn.tool_call_id)
        arguments = call.arguments if call is not None and isinstance(call.arguments, dict) else {}
        changed = result.workspace_diff is not None and result.workspace_diff != diff
        if changed:
            diff = result.workspace_diff
        edited = turn.name == "str_replace_editor" and arguments.get("command") in EDIT_COMMANDS \
            and result.exit_code == 0
        if changed or edited:
            events.append(RepairEvent(turn=index, kind="edit", tool=turn.name, diff=diff))
        passed = None
        if turn.name == "run_tests" and result.exit_code is not None:
            passed = result.exit_code == 0
        elif turn.name == "bash" and isinstance(arguments.get("command"), str) \
                and RUNS_PYTEST.search(arguments["command"]):
            passed = pytest_passed(turn.content)
        if passed is not None:
            events.append(RepairEvent(turn=index, kind="test", tool=turn.name, output=turn.content, passed=passed))
    return events


def fix_chain(events: list[RepairEvent]) -> tuple[RepairEvent, RepairEvent, RepairEvent] | None:
    """The first passing test run that follows an edit that follows a failing run, with that edit and the last
    failing run before it (fail, edit, fail, edit, pass: the second failure and edit are what the fix answered)."""
    failing = answered = None
    for event in events:
        if event.kind == "edit":
            if failing is not None:
                answered = (failing, event)
        elif not event.passed:
            failing = event
        elif answered is not None:
            return (*answered, event)
    return None


def repair(turns: list[Turn], reward: float | None) -> Repair:
    """The repair of a trajectory's `turns` graded `reward` (the replay page reads an archived row's)."""
    events = repair_events(turns)
    chain = fix_chain(events)
    if not events or reward is None:
        outcome = None
    elif reward != 1:
        outcome = GAVE_UP
    else:
        outcome = FIXED_BY_FEEDBACK if chain is not None else GUESSED
    return Repair(tuple(events), chain, outcome)


def repair_outcome(trajectory: Trajectory) -> str | None:
    return repair(trajectory.turns, trajectory.reward).outcome


def repair_points(trajectories: Iterable[Trajectory], *, prefix: str = "") -> dict[str, float]:
    """{prefix + "repair/fixed_after_feedback": fixed_by_feedback / solved} over the solved repair trajectories; {}
    where none was solved (a run without repair tasks charts no such line)."""
    outcomes = [repair_outcome(t) for t in trajectories]
    solved = sum(outcome in (FIXED_BY_FEEDBACK, GUESSED) for outcome in outcomes)
    if not solved:
        return {}
    return {prefix + FIXED_AFTER_FEEDBACK: outcomes.count(FIXED_BY_FEEDBACK) / solved}

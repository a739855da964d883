"""The reference check's engine half: a bundle's own reference answers, rolled out and graded like a policy's.

Before a team trains on a bundle, each template's reference answers (canonical solutions, reference scripts,
cited answers) should pass its verifier in its sandbox image; a template whose references fail has a broken
task, image or verifier, and a run on it would learn from noise (SWE-bench validates its gold patches the same
way). The assistant's turns are the task's reference instead of samples — the canonical solution first run on
the prompt's example with the template's tool, when it has one, in the sandbox, then the answer — and
everything else is what a training rollout does: the same tool runner and accounting, the same grading.
The studio's side (apps/runs/attempts/reference.py) archives the result as a run of one step.
"""

from __future__ import annotations

import random
import time
from concurrent.futures import ThreadPoolExecutor

from ..models.base_model import reference_turns
from ..protocols import ToolRunner, Verifier
from ..tasks.taskset import TaskSet
from ..types import Task, ToolCall, Trajectory, Turn, trajectory_id
from .agent import record_tool_result
from .grading import grade_trajectory
from .metrics import Prices, trajectory_cost
from .sessions import LIMIT, TrajectoryTools
from .tools import parse_tool_calls

OUTCOMES = ("checked", "passed", "failed", "ungraded")


def reference_answers(task: Task) -> list[str] | None:
    """The assistant's messages of the task's reference, calling the template's tool first when it has one (the
    canonical solution run on the prompt's example); None if the task has no reference. The tool's output is
    left out: it comes from the sandbox, never from here."""
    turns = reference_turns(tools=task.template.tools, inputs=task.item.inputs, hidden=task.item.hidden,
                            rng=random.Random(0), tool_call_fraction=1.0)
    return None if turns is None else [m["content"] for m in turns if m["role"] == "assistant"]


def reference_tasks(tasks: TaskSet, *, per_template: int) -> list[tuple[Task, list[str]]]:
    """The first `per_template` tasks (by key) of every template that have a reference, with its messages."""
    chosen: list[tuple[Task, list[str]]] = []
    for template_key in sorted(tasks.templates):
        found = 0
        for task_key in sorted(tasks.items[template_key]):
            if found == per_template:
                break
            task = tasks.task(len(chosen), template_key, task_key)
            answers = reference_answers(task)
            if answers is not None:
                chosen.append((task, answers))
                found += 1
    return chosen


def reference_rollout(run_id: str, task: Task, answers: list[str], tool_runner: ToolRunner) -> Trajectory:
    """A trajectory whose assistant turns are the reference's `answers`, and whose tool turns are what the
    sandbox answered to the reference's calls (the same tool runner and accounting as a training rollout's)."""
    template, started = task.template, time.monotonic()
    trajectory = Trajectory(id=trajectory_id(run_id, task.seq, 0), run_id=run_id, seq=task.seq, sample=0,
                            domain=template.domain, template=template.key, task_key=task.item.key,
                            task_hash=task.item_hash, image=template.image.key, verifier=template.verifier_key,
                            policy_version=0, started_at=time.time(), step=1,
                            turns=[Turn(role=m["role"], content=m["content"])
                                   for m in template.messages(task.item, examples=False)])
    tools = template.tools
    trajectory_tools = TrajectoryTools(tool_runner, template, task.item)  # a session's, for a template with one
    try:
        for index, text in enumerate(answers):
            calls = parse_tool_calls(text, tools) if tools else []
            trajectory.turns.append(Turn(
                role="assistant", content=text, finish_reason="tool_calls" if calls else "stop",
                started_s=round(time.monotonic() - started, 4),
                tool_calls=[ToolCall(id=f"call-{index}-{n}", name=c.name, arguments=c.arguments)
                            for n, c in enumerate(calls)]))
            for call in trajectory.turns[-1].tool_calls:
                call_started = time.monotonic()
                result = trajectory_tools.run(call.name, call.arguments)
                if result.status == LIMIT:
                    trajectory.status_reason, trajectory.limit_hit = result.text, f"session_{result.reason}"
                    return trajectory
                if record_tool_result(trajectory, call, result, call_started=call_started,
                                      started=started) is None:
                    return trajectory
    finally:
        trajectory_tools.close()
    trajectory.timings["rollout"] = time.monotonic() - started
    return trajectory


def check_references(run_id: str, chosen: list[tuple[Task, list[str]]], *, tool_runner: ToolRunner,
                     verifier: Verifier, prices: Prices, concurrency: int) -> list[Trajectory]:
    """Roll out and grade every chosen reference, `concurrency` at a time; each trajectory carries its cost."""

    def check(task: Task, answers: list[str]) -> Trajectory:
        trajectory = reference_rollout(run_id, task, answers, tool_runner)
        grade_trajectory(verifier, task, trajectory)
        trajectory_cost(trajectory, prices)
        return trajectory

    with ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="reference") as threads:
        return list(threads.map(check, *zip(*chosen, strict=True)))


def reference_report(trajectories: list[Trajectory]) -> tuple[dict[str, dict], dict[str, float]]:
    """Per template: references checked, passed, failed (graded below 1) and ungraded (the verifier could not
    decide), and the first that did not pass; and the step's reward points."""
    templates: dict[str, dict] = {}
    for trajectory in trajectories:
        entry = templates.setdefault(trajectory.template, {"domain": trajectory.domain, **dict.fromkeys(OUTCOMES, 0),
                                                           "first_problem": None})
        entry["checked"] += 1
        # Ungraded: the verifier could not decide (no judge configured, a sandbox that would not start); that
        # says nothing against the reference, but the template cannot be trained on as it stands.
        outcome = "passed" if trajectory.reward == 1.0 else "ungraded" if trajectory.reward is None else "failed"
        entry[outcome] += 1
        if outcome != "passed" and (entry["first_problem"] is None or
                                    (outcome == "failed" and entry["first_problem"]["outcome"] != "failed")):
            entry["first_problem"] = {"task": trajectory.task_key, "outcome": outcome,
                                      "why": trajectory.status_reason or (trajectory.verdict.stopped_because
                                                                          if trajectory.verdict else None)}
    # Rewards of the graded references only, as a run's reward/* are: an ungraded one is no zero.
    rewards: dict[str, list[float]] = {}
    for trajectory in trajectories:
        if trajectory.reward is not None:
            rewards.setdefault(trajectory.domain, []).append(trajectory.reward)
    points = {f"reward/{domain}": sum(r) / len(r) for domain, r in rewards.items()}
    graded = [r for domain_rewards in rewards.values() for r in domain_rewards]
    if graded:
        points["reward/mean"] = sum(graded) / len(graded)
    return templates, points

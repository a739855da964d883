"""Evaluation on the engine's side.

- A run's own evaluation: a fixed sample of tasks per domain, one sample each at the current weights, graded
  like training rollouts; measured at the start of a run and at its end (`eval/reward/<domain>`).
- An eval suite's (apps/evals): every task the suite names, `samples_per_task` answers each at the suite's
  temperature, from any engine — a checkpoint, a base model, or an OpenAI-compatible endpoint — through the same
  agent loop, sandboxes and verifiers as training.
"""

from __future__ import annotations

import math
import random
from concurrent.futures import Executor, ThreadPoolExecutor
from typing import Protocol

from ..tasks.taskset import TaskSet
from ..types import Task, Trajectory
from .idle import PhaseBoard
from .metrics import Prices, trajectory_cost


class EvalRollout(Protocol):
    def __call__(self, tasks: list[Task], group_size: int, tools: Executor) -> list[list[Trajectory]]: ...


def evaluate(tasks: list[Task], *, rollout: EvalRollout, verify, rollout_concurrency: int,
             verify_concurrency: int) -> tuple[dict[str, float], list[Trajectory]]:
    """Mean reward per domain over `tasks` (trajectories the verifier could not grade count for nothing), and the
    graded trajectories (the run's other evaluation metrics read them: feedback.repair_points)."""
    # Executors of its own: the evaluation at the end runs after the collectors' have closed.
    with ThreadPoolExecutor(max_workers=rollout_concurrency, thread_name_prefix="rl-eval-tools") as tools:
        groups = rollout(tasks, 1, tools)
    with ThreadPoolExecutor(max_workers=verify_concurrency, thread_name_prefix="rl-eval") as threads:
        list(threads.map(verify, tasks, [group[0] for group in groups]))
    rewards: dict[str, list[float]] = {}
    for task, [trajectory] in zip(tasks, groups, strict=True):
        if trajectory.reward is not None:
            rewards.setdefault(task.domain, []).append(trajectory.reward)
    return ({domain: round(sum(r) / len(r), 4) for domain, r in sorted(rewards.items())},
            [trajectory for [trajectory] in groups])


# --- suites ----------------------------------------------------------------------------------------------

BATCH_TASKS = 16  # tasks per archived step of an evaluation: its progress, and the most a resumed attempt redoes


def evaluation_steps(task_count: int) -> int:
    return max(1, math.ceil(task_count / BATCH_TASKS))


def suite_tasks(tasks: TaskSet, *, per_template: int, seed: int) -> list[Task]:
    """The tasks an eval suite asks: every instance of every template (per_template 0), or a seeded sample of
    `per_template` of each; in template and key order, so two evaluations of one suite answer the same tasks in
    the same order (their trajectories pair up by task)."""
    chosen: list[Task] = []
    rng = random.Random(seed)
    for template_key in sorted(tasks.templates):
        keys = sorted(tasks.items[template_key])
        if per_template and per_template < len(keys):
            keys = sorted(rng.sample(keys, per_template))
        chosen += [tasks.task(len(chosen) + index, template_key, key) for index, key in enumerate(keys)]
    return chosen


def evaluate_batch(tasks: list[Task], *, run_id: str, step: int, engine, chat, tool_runner, verifier, prices: Prices,
                   samples: int, temperature: float, seed: int, rollout_concurrency: int,
                   verify_concurrency: int) -> list[Trajectory]:
    """`samples` answers to each task from `engine`, through the template's tools and its verifier, exactly as a
    training rollout is made and graded; each trajectory carries its cost and `step` (the batch)."""
    from .agent import rollout_groups  # the agent loop imports the engines; this module stays light for workers
    from .grading import grade_trajectory

    board = PhaseBoard()
    with ThreadPoolExecutor(max_workers=rollout_concurrency, thread_name_prefix="eval-tools") as tools:
        groups = rollout_groups(tasks, run_id=run_id, group_size=samples, engine=engine, chat=chat,
                                tool_runner=tool_runner, tool_executor=tools, board=board, seed=seed,
                                temperature=temperature)

    def grade(task: Task, trajectory: Trajectory) -> Trajectory:
        grade_trajectory(verifier, task, trajectory)
        trajectory_cost(trajectory, prices)
        trajectory.step = step
        board.finish(trajectory.id)
        return trajectory

    pairs = [(task, trajectory) for task, group in zip(tasks, groups, strict=True) for trajectory in group]
    with ThreadPoolExecutor(max_workers=verify_concurrency, thread_name_prefix="eval-verify") as threads:
        return list(threads.map(lambda pair: grade(*pair), pairs))

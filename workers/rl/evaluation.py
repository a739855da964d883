"""The run's evaluation: a fixed sample of tasks per domain, one sample each at the current weights, graded
like training rollouts. Measured at the start of a run and at its end (`eval/reward/<domain>`)."""

from __future__ import annotations

from concurrent.futures import Executor, ThreadPoolExecutor
from typing import Protocol

from .types import Task, Trajectory


class EvalRollout(Protocol):
    def __call__(self, tasks: list[Task], group_size: int, tools: Executor) -> list[list[Trajectory]]: ...


def evaluate(tasks: list[Task], *, rollout: EvalRollout, verify, rollout_concurrency: int,
             verify_concurrency: int) -> dict[str, float]:
    """Mean reward per domain over `tasks`; trajectories the verifier could not grade count for nothing."""
    # Executors of its own: the evaluation at the end runs after the collectors' have closed.
    with ThreadPoolExecutor(max_workers=rollout_concurrency, thread_name_prefix="rl-eval-tools") as tools:
        groups = rollout(tasks, 1, tools)
    with ThreadPoolExecutor(max_workers=verify_concurrency, thread_name_prefix="rl-eval") as threads:
        list(threads.map(verify, tasks, [group[0] for group in groups]))
    rewards: dict[str, list[float]] = {}
    for task, [trajectory] in zip(tasks, groups, strict=True):
        if trajectory.reward is not None:
            rewards.setdefault(task.domain, []).append(trajectory.reward)
    return {domain: round(sum(r) / len(r), 4) for domain, r in sorted(rewards.items())}

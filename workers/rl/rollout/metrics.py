"""The run's numbers: namespaced metric points per trainer step, and the cumulative counters behind them.

Names (CleanRL-style namespaces): reward/mean, reward/<domain>, reward/slope_per_hour,
throughput/trajectories_per_hour, throughput/effective_trajectories_per_hour, throughput/tokens_per_second,
cost/per_task, cost/total, idle/<cause> (seconds the trainer waited during the step: environment_assembly,
generation, tools, verification, timeouts — what the rollouts were doing meanwhile — and its own chores:
weight_sync, handing the engine the new weights, and archive, writing the previous step and its checkpoint),
trainer/busy_fraction, trainer/step_seconds, staleness/mean, staleness/max (of the trained trajectories' oldest
trained tokens), tokens_by_staleness/<k> (the step's trained tokens sampled k versions before the weights trained,
and tokens_by_staleness/too_stale: those partial rollouts left out of the loss), policy/kl, policy/entropy,
policy/clip_fraction, policy/grad_norm, loss/policy, groups/effective_fraction, infra/retries, infra/errors,
trajectories/<status>, repair/fixed_after_feedback (of the step's solved repair trajectories, the share fixed after
test feedback: rollout/feedback.py; only at steps that solved some).

Rates are over the run's *active* time (the seconds some attempt was running it), so a run that was paused
or lost its worker for an hour is not shown as slow.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from ..types import Trajectory, TrajectoryStatus
from .feedback import repair_points

SLOPE_WINDOW = 50  # steps of reward/mean the slope is fitted over


@dataclass(frozen=True)
class Prices:
    """Money per hour of policy compute (the accelerator the model runs on) and of sandbox CPU; the judge's
    cost comes with each verdict."""

    gpu_per_hour: float = 0.0
    sandbox_cpu_per_hour: float = 0.0


def trajectory_cost(trajectory: Trajectory, prices: Prices) -> float:
    costs = trajectory.costs
    total = (costs.get("policy_seconds", 0.0) * prices.gpu_per_hour
             + (costs.get("sandbox_cpu_seconds", 0.0) + costs.get("verification_seconds", 0.0))
             * prices.sandbox_cpu_per_hour) / 3600 + costs.get("judge", 0.0)
    costs["total"] = round(total, 8)
    return total


@dataclass
class RunCounters:
    active_seconds: float = 0.0
    trainer_seconds: float = 0.0
    trajectories: int = 0
    effective_trajectories: int = 0
    completion_tokens: int = 0
    cost: float = 0.0
    statuses: dict = field(default_factory=lambda: defaultdict(int))
    reward_history: list = field(default_factory=list)  # [active_seconds, reward/mean] per step
    idle: dict = field(default_factory=lambda: defaultdict(float))
    staleness_max: int = 0
    limits_seen: list = field(default_factory=list)  # limits a trajectory of this run hit: charted from then on
    tokens_by_staleness: dict = field(default_factory=dict)  # trained tokens by versions behind ("too_stale": left out)

    def state(self) -> dict:
        return {"active_seconds": self.active_seconds, "trainer_seconds": self.trainer_seconds,
                "trajectories": self.trajectories, "effective_trajectories": self.effective_trajectories,
                "completion_tokens": self.completion_tokens, "cost": self.cost, "statuses": dict(self.statuses),
                "reward_history": self.reward_history[-SLOPE_WINDOW:], "idle": dict(self.idle),
                "staleness_max": self.staleness_max, "limits_seen": list(self.limits_seen),
                "tokens_by_staleness": dict(self.tokens_by_staleness)}

    @classmethod
    def from_state(cls, state: dict) -> RunCounters:
        counters = cls(**{k: v for k, v in state.items() if k not in ("statuses", "idle")})
        counters.statuses = defaultdict(int, state.get("statuses", {}))
        counters.idle = defaultdict(float, state.get("idle", {}))
        return counters


def slope_per_hour(history: list) -> float:
    """Least-squares slope of reward over active hours, on the last SLOPE_WINDOW steps."""
    points = history[-SLOPE_WINDOW:]
    if len(points) < 3:
        return 0.0
    xs = [p[0] / 3600 for p in points]
    ys = [p[1] for p in points]
    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
    spread = sum((x - mean_x) ** 2 for x in xs)
    return 0.0 if spread == 0 else sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / spread


def token_staleness(trained: list[Trajectory], *, version: int, oldest_version: int | None,
                    max_staleness: int) -> tuple[list[int], dict[str, int]]:
    """How stale a step's training data was, trained at `version`: each trained trajectory's staleness (versions
    behind, of its oldest token in the loss), and the trained tokens counted by their staleness, 0 to
    max_staleness always (a stacked chart wants every series at every step), and "too_stale" for those partial
    rollouts (`oldest_version`) left out of the loss."""
    counts = {str(k): 0 for k in range(max_staleness + 1)}
    if oldest_version is not None:
        counts["too_stale"] = 0
    staleness = []
    for t in trained:
        kept = []
        for v in t.trained_versions():
            if oldest_version is not None and v < oldest_version:
                counts["too_stale"] += 1
            else:
                kept.append(v)
                counts[str(version - v)] = counts.get(str(version - v), 0) + 1
        staleness.append(version - min(kept, default=t.policy_version))
    return staleness, counts


def step_points(*, counters: RunCounters, consumed: list[Trajectory], trained: list[Trajectory], stats,
                idle: dict[str, float], step_seconds: float, groups: int, effective_groups: int,
                generation_tokens_per_second: float, staleness: list[int],
                tokens_by_staleness: dict[str, int] | None = None) -> dict[str, float]:
    """The points of one step; updates `counters` with it."""
    scored = [t for t in consumed if t.status != TrajectoryStatus.INFRA_ERROR and t.reward is not None]
    points: dict[str, float] = {}
    if scored:
        points["reward/mean"] = sum(t.reward for t in scored) / len(scored)
        by_domain = defaultdict(list)
        for t in scored:
            by_domain[t.domain].append(t.reward)
        for domain, rewards in sorted(by_domain.items()):
            points[f"reward/{domain}"] = sum(rewards) / len(rewards)
        counters.reward_history.append([counters.active_seconds, points["reward/mean"]])
        counters.reward_history = counters.reward_history[-SLOPE_WINDOW:]
    counters.trajectories += len(consumed)
    counters.effective_trajectories += len(trained)
    counters.completion_tokens += sum(t.completion_tokens for t in consumed)
    counters.cost += sum(t.costs.get("total", 0.0) for t in consumed)
    for t in consumed:
        counters.statuses[str(t.status)] += 1
    hours = max(counters.active_seconds, 1e-9) / 3600
    points["reward/slope_per_hour"] = slope_per_hour(counters.reward_history)
    points["throughput/trajectories_per_hour"] = counters.trajectories / hours
    points["throughput/effective_trajectories_per_hour"] = counters.effective_trajectories / hours
    points["throughput/tokens_per_second"] = generation_tokens_per_second
    points["cost/total"] = counters.cost
    points["cost/per_task"] = counters.cost / max(counters.trajectories, 1)
    for cause, seconds in idle.items():
        points[f"idle/{cause}"] = seconds
        counters.idle[cause] += seconds
    points["trainer/busy_fraction"] = counters.trainer_seconds / max(counters.active_seconds, 1e-9)
    points["trainer/step_seconds"] = step_seconds
    if staleness:
        points["staleness/mean"] = sum(staleness) / len(staleness)
        points["staleness/max"] = max(staleness)
        counters.staleness_max = max(counters.staleness_max, max(staleness))
    for key, count in (tokens_by_staleness or {}).items():
        points[f"tokens_by_staleness/{key}"] = count
        counters.tokens_by_staleness[key] = counters.tokens_by_staleness.get(key, 0) + count
    if stats is not None and stats.sequences:  # a step without signal updated nothing
        points.update({"policy/kl": stats.kl, "policy/entropy": stats.entropy,
                       "policy/clip_fraction": stats.clip_fraction, "policy/grad_norm": stats.grad_norm,
                       "loss/policy": stats.loss})
    points["groups/effective_fraction"] = effective_groups / max(groups, 1)
    points.update(trajectory_shape_points(consumed, counters))
    points.update(repair_points(consumed))
    points["infra/retries"] = sum(t.tool_retries for t in consumed)
    points["infra/restarts"] = sum(t.restarts for t in consumed)
    points["infra/errors"] = sum(t.status == TrajectoryStatus.INFRA_ERROR for t in consumed)
    for status in (TrajectoryStatus.TIMEOUT, TrajectoryStatus.POLICY_ERROR):
        points[f"trajectories/{status}"] = sum(t.status == status for t in consumed)
    return points


def trajectory_shape_points(consumed: list[Trajectory], counters: RunCounters) -> dict[str, float]:
    """Long trajectories at a glance: turns and tool calls per trajectory, and the share of the step's trajectories
    that hit each limit (trajectory.limit_hit: turns, tokens, seconds, tool_calls, context, a session's, or a turn's
    own), every limit the run has hit so far charted at each step (0 when none hit it)."""
    if not consumed:
        return {}
    turns = [sum(turn.role == "assistant" for turn in t.turns) for t in consumed]
    calls = [sum(len(turn.tool_calls) for turn in t.turns) for t in consumed]
    points = {"turns/per_trajectory_mean": sum(turns) / len(turns), "turns/per_trajectory_max": max(turns),
              "turns/tool_calls_mean": sum(calls) / len(calls)}
    for t in consumed:
        if t.limit_hit and t.limit_hit not in counters.limits_seen:
            counters.limits_seen.append(t.limit_hit)
    for limit in counters.limits_seen:
        points[f"limits/{limit}"] = sum(t.limit_hit == limit for t in consumed) / len(consumed)
    points["limits/any"] = sum(bool(t.limit_hit) for t in consumed) / len(consumed)
    return points


def step_events(consumed: list[Trajectory]) -> list[tuple[str, str, dict]]:
    """The run events a step's trajectories call for: sandbox retries, and trajectories lost to infrastructure."""
    events = []
    retries = sum(t.tool_retries for t in consumed)
    if retries:
        events.append(("retry", f"{retries} sandbox call(s) retried after infrastructure errors", {}))
    infra = [t for t in consumed if t.status == TrajectoryStatus.INFRA_ERROR]
    if infra:
        events.append(("retry", f"{len(infra)} trajectory(ies) lost to infrastructure errors and not trained on: "
                                f"{infra[0].status_reason[:200]}", {}))
    return events


def run_summary(*, mode: str, max_staleness: int, counters: RunCounters, eval_start: dict, eval_end: dict) -> dict:
    """GRPO's part of what an attempt reports at its end (the run's page and `train --json` show it; the training
    loop adds the run, outcome, steps and times: training/loop.py)."""
    hours = max(counters.active_seconds, 1e-9) / 3600
    return {
        "mode": mode,
        "reward": {"start": eval_start, "end": eval_end,
                   "lift": {d: round(eval_end[d] - eval_start[d], 4) for d in eval_end if d in eval_start}},
        "trajectories": {"total": counters.trajectories, "effective": counters.effective_trajectories,
                         **dict(counters.statuses)},
        "throughput": {"trajectories_per_hour": round(counters.trajectories / hours, 1),
                       "effective_trajectories_per_hour": round(counters.effective_trajectories / hours, 1)},
        "cost": {"per_task": counters.cost / max(counters.trajectories, 1), "total": counters.cost},
        "trainer_busy_fraction": round(counters.trainer_seconds / max(counters.active_seconds, 1e-9), 4),
        "idle_seconds": {cause: round(seconds, 2) for cause, seconds in counters.idle.items()},
        "staleness": {"max": counters.staleness_max, "bound": max_staleness,
                      "tokens": dict(sorted(counters.tokens_by_staleness.items()))},
    }

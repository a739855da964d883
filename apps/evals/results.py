"""Reading evaluations: rewards per task from their trajectories, scores with intervals, leaderboards, paired
comparisons and per-task diffs. A trajectory the infrastructure failed (no reward) is left out and counted:
it is never a wrong answer."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field, replace

from apps.common.errors import StudioError
from apps.trajectories.models import Trajectory
from workers.rl.tasks.overlap import task_label

from . import statistics
from .models import Evaluation
from .suites import key_differences

ALL = "all"  # the row of every domain together


class NotComparable(StudioError, ValueError):
    """Two evaluations whose suites' keys differ; the message names what differs."""

    status = 409


@dataclass
class Rewards:
    by_domain: dict[str, dict[str, list[float]]]  # domain -> task -> rewards of its samples
    trajectories: dict[str, list[str]]  # task -> trajectory ids, sample order
    infra_errors: int
    cost: float = 0.0  # money: the model's compute, sandbox CPU and judge calls of every answer

    def domain(self, name: str) -> dict[str, list[float]]:
        if name == ALL:
            return {task: values for tasks in self.by_domain.values() for task, values in tasks.items()}
        return self.by_domain.get(name, {})


def evaluation_rewards(evaluation: Evaluation) -> Rewards:
    by_domain: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    ids: dict[str, list[str]] = defaultdict(list)
    infra, cost = 0, 0.0
    rows = (Trajectory.objects.filter(run_id=evaluation.run_id).order_by("seq", "sample")
            .values_list("id", "domain", "template", "task_key", "reward", "cost"))
    for pk, domain, template, task_key, reward, spent in rows.iterator(chunk_size=5000):
        task = task_label(template, task_key)
        cost += spent
        ids[task].append(str(pk))
        if reward is None:
            infra += 1
        else:
            by_domain[domain][task].append(reward)
    return Rewards({d: dict(t) for d, t in by_domain.items()}, dict(ids), infra, cost)


@dataclass
class Row:
    evaluation: Evaluation
    scores: dict[str, statistics.Score] = field(default_factory=dict)
    infra_errors: int = 0
    cost: float = 0.0
    # Where the evaluated checkpoint's training pool is known: the scores on the suite's tasks it did not train
    # on, and on those it did (exactly or as a near duplicate).
    clean: dict[str, statistics.Score] = field(default_factory=dict)
    overlapping: dict[str, statistics.Score] = field(default_factory=dict)
    # Every domain's mean score (the mean over its tasks of their mean reward), without an interval: cheap enough
    # for a thousand domains, to sort and filter by before the shown ones are scored in full (Leaderboard.score).
    means: dict[str, float | None] = field(default_factory=dict)
    rewards: Rewards | None = field(default=None, repr=False)


@dataclass
class Leaderboard:
    domains: list[str]  # every domain any row answered, by name, then ALL
    rows: list[Row]
    groups: dict[str, dict[int, int]]  # domain -> evaluation id -> its tied group (1: tied with the best)

    def score(self, names) -> None:
        """Score `names` (domains, or ALL) in full for every row that answered them: the interval, pass@k, clean
        and trained-on scores, and the tied groups. A bootstrap a domain and row: a page scores the domains it
        shows, not all thousand."""
        for name in names:
            if name in self.groups:
                continue
            for row in self.rows:
                if name != ALL and name not in row.rewards.by_domain:
                    continue
                tasks = row.rewards.domain(name)
                row.scores[name] = statistics.score(tasks)
                overlap = row.evaluation.overlap
                if overlap:
                    seen = set(overlap.get("exact", [])) | set(overlap.get("near", []))
                    row.clean[name] = statistics.score({t: r for t, r in tasks.items() if t not in seen})
                    row.overlapping[name] = statistics.score({t: r for t, r in tasks.items() if t in seen})
            tied = statistics.tied_groups({r.evaluation.pk: r.scores[name] for r in self.rows if name in r.scores})
            self.groups[name] = {pk: number for number, group in enumerate(tied, start=1) for pk in group}


def _mean_score(tasks: dict[str, list[float]]) -> float | None:
    means = [sum(values) / len(values) for values in tasks.values() if values]
    return sum(means) / len(means) if means else None


def leaderboard(evaluations: list[Evaluation], *, domains=None) -> Leaderboard:
    """Rows of evaluations of one comparability key (the caller groups by key), scores per domain and overall:
    every domain scored in full, or only `domains` (and overall; each row's `means` holds every domain's mean)."""
    rows, names = [], set()
    for evaluation in evaluations:
        rewards = evaluation_rewards(evaluation)
        names |= set(rewards.by_domain)
        rows.append(Row(evaluation, infra_errors=rewards.infra_errors, cost=rewards.cost, rewards=rewards,
                        means={name: _mean_score(tasks) for name, tasks in rewards.by_domain.items()}))
    board = Leaderboard([*sorted(names), ALL], rows, {})
    board.score([*(sorted(names) if domains is None else domains), ALL])
    rows.sort(key=lambda r: -(r.scores[ALL].mean if r.scores[ALL].mean is not None else -1))
    return board


def comparable(a: Evaluation, b: Evaluation) -> None:
    if a.key != b.key:
        raise NotComparable(f"{a.label} and {b.label} were not evaluated under the same suite key: "
                            + "; ".join(key_differences(a.key_parts, b.key_parts) or ["their keys differ"]))


@dataclass
class Paired:
    a: Evaluation
    b: Evaluation
    by_domain: dict[str, statistics.Comparison]
    left: Rewards | None = field(default=None, repr=False)
    right: Rewards | None = field(default=None, repr=False)

    def intervals(self, names) -> None:
        """The bootstrap interval of each domain in `names` that has none yet (compare(..., intervals=False))."""
        for name in names:
            found = self.by_domain.get(name)
            if found is None or found.low is not None or found.difference is None:
                continue
            full = statistics.compare(self.left.domain(name), self.right.domain(name))
            self.by_domain[name] = replace(found, low=full.low, high=full.high)


def compare(a: Evaluation, b: Evaluation, *, intervals: bool = True) -> Paired:
    """b against a, paired by task, per domain (Benjamini-Hochberg across the domains) and overall. Without
    `intervals`, only the overall comparison has its bootstrap interval: a page of hundreds of domains works out
    its rows' with Paired.intervals."""
    comparable(a, b)
    left, right = evaluation_rewards(a), evaluation_rewards(b)
    domains = sorted(set(left.by_domain) | set(right.by_domain))
    adjusted = statistics.adjust({d: statistics.compare(left.domain(d), right.domain(d), interval=intervals)
                                  for d in domains})
    adjusted[ALL] = statistics.compare(left.domain(ALL), right.domain(ALL))
    return Paired(a, b, adjusted, left, right)


@dataclass
class TaskChange:
    task: str
    domain: str
    a: float | None
    b: float | None
    a_trajectory: str | None
    b_trajectory: str | None

    @property
    def change(self) -> float:
        return (self.b or 0.0) - (self.a or 0.0)


def task_diff(a: Evaluation, b: Evaluation) -> tuple[list[TaskChange], list[TaskChange]]:
    """(regressions, improvements): tasks whose mean reward fell or rose from a to b, largest change first."""
    comparable(a, b)
    left, right = evaluation_rewards(a), evaluation_rewards(b)
    changes = []
    for domain in sorted(set(left.by_domain) | set(right.by_domain)):
        l_tasks, r_tasks = left.domain(domain), right.domain(domain)
        for task in sorted(set(l_tasks) | set(r_tasks)):
            mean_a = sum(l_tasks[task]) / len(l_tasks[task]) if task in l_tasks else None
            mean_b = sum(r_tasks[task]) / len(r_tasks[task]) if task in r_tasks else None
            if mean_a == mean_b:
                continue
            changes.append(TaskChange(task, domain, mean_a, mean_b, (left.trajectories.get(task) or [None])[0],
                                      (right.trajectories.get(task) or [None])[0]))
    regressions = sorted((c for c in changes if c.change < 0), key=lambda c: c.change)
    improvements = sorted((c for c in changes if c.change > 0), key=lambda c: -c.change)
    return regressions, improvements

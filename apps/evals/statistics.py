"""The statistics of an eval leaderboard: a score with an interval that says how sure it is, and a paired
comparison that tells a real difference from noise.

- A score per (model, suite, domain) is the mean over tasks of the task's mean reward over its samples. Its
  interval is a bootstrap over tasks (samples of one task are a cluster: resampling them one by one would
  pretend they are independent and narrow the interval), or Wilson's for a plain proportion (one 0/1 sample a
  task), which behaves near 0 and 1 where the normal approximation does not.
- pass@k (the unbiased estimator of Chen et al. 2021) and pass^k (all k samples pass, tau-bench) when a task has
  several samples.
- Two models that answered the same tasks are compared paired: the mean of per-task differences with a paired
  bootstrap interval, and McNemar's exact test on the tasks one passed and the other failed (a binomial test on
  the discordant pairs, scipy). Across domains, Benjamini-Hochberg controls the false discovery rate.
- Models whose intervals overlap a leader's are "tied" with it: the page shows groups, not a strict rank.
- Before launching, the minimum detectable difference of a paired comparison for a suite's size.

scipy supplies the tests (binomtest, false_discovery_control, norm); the bootstrap is numpy, vectorised.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
from scipy import stats

PASS = 1.0  # a reward at or above this passes (verdict "pass")
BOOTSTRAP_SAMPLES = 2000
CONFIDENCE = 0.95


@dataclass(frozen=True)
class Score:
    mean: float | None
    low: float | None
    high: float | None
    tasks: int
    samples: int
    method: str  # "bootstrap over tasks", "wilson", or why there is no interval
    pass_at_k: dict[int, float] = field(default_factory=dict)
    pass_hat_k: dict[int, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Comparison:
    """b minus a over the tasks both answered."""

    tasks: int
    difference: float | None
    low: float | None
    high: float | None
    a_only: int  # tasks a passed and b failed (discordant)
    b_only: int
    p_value: float | None  # McNemar's exact test
    q_value: float | None = None  # Benjamini-Hochberg, set across a family of comparisons
    significant: bool = False

    @property
    def verdict(self) -> str:
        return self.verdict_for("b")

    def verdict_for(self, b: str) -> str:
        """The verdict with the side the difference is measured for named `b` (a page names it by what it
        evaluated)."""
        if self.difference is None:
            return "no shared tasks"
        if not self.significant:
            return "no significant difference"
        return f"{b} better" if self.difference > 0 else f"{b} worse"


def wilson(successes: int, total: int, confidence: float = CONFIDENCE) -> tuple[float, float]:
    if total == 0:
        return (0.0, 1.0)
    z = stats.norm.ppf(0.5 + confidence / 2)
    p = successes / total
    centre = (p + z * z / (2 * total)) / (1 + z * z / total)
    half = z * math.sqrt(p * (1 - p) / total + z * z / (4 * total * total)) / (1 + z * z / total)
    return (max(0.0, centre - half), min(1.0, centre + half))


def pass_at_k(n: int, c: int, k: int) -> float:
    """The chance that at least one of k samples drawn without replacement from n (c of them correct) passes."""
    if n - c < k:
        return 1.0
    return 1.0 - float(np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def pass_hat_k(n: int, c: int, k: int) -> float:
    """The chance that all of k samples drawn without replacement from n pass: C(c, k) / C(n, k)."""
    return math.comb(c, k) / math.comb(n, k) if k <= n else 0.0


def _bootstrap_means(values: np.ndarray, rng: np.random.Generator, samples: int) -> np.ndarray:
    picks = rng.integers(0, len(values), size=(samples, len(values)))
    return values[picks].mean(axis=1)


def score(rewards: Mapping[str, Sequence[float]], *, seed: int = 0, samples: int = BOOTSTRAP_SAMPLES,
          confidence: float = CONFIDENCE) -> Score:
    """The score of one model on a set of tasks: `rewards` maps each task to its samples' rewards."""
    per_task = {task: [float(r) for r in values] for task, values in rewards.items() if len(values)}
    if not per_task:
        return Score(None, None, None, 0, 0, "no graded task")
    means = np.array([np.mean(values) for values in per_task.values()])
    counts = [len(values) for values in per_task.values()]
    total = sum(counts)
    binary = all(r in (0.0, 1.0) for values in per_task.values() for r in values)
    ks = [k for k in (1, 2, 4, 8, 16) if k <= min(counts)] if min(counts) > 1 else []
    passes = [(len(values), sum(r >= PASS for r in values)) for values in per_task.values()]
    at_k = {k: float(np.mean([pass_at_k(n, c, k) for n, c in passes])) for k in ks}
    hat_k = {k: float(np.mean([pass_hat_k(n, c, k) for n, c in passes])) for k in ks}
    if binary and max(counts) == 1:
        low, high = wilson(int(means.sum()), len(means), confidence)
        return Score(float(means.mean()), low, high, len(means), total, "wilson", at_k, hat_k)
    if len(means) < 2:
        return Score(float(means.mean()), None, None, 1, total, "one task: no interval", at_k, hat_k)
    draws = _bootstrap_means(means, np.random.default_rng(seed), samples)
    tail = (1 - confidence) / 2 * 100
    low, high = np.percentile(draws, [tail, 100 - tail])
    return Score(float(means.mean()), float(low), float(high), len(means), total, "bootstrap over tasks",
                 at_k, hat_k)


def compare(a: Mapping[str, Sequence[float]], b: Mapping[str, Sequence[float]], *, seed: int = 0,
            samples: int = BOOTSTRAP_SAMPLES, confidence: float = CONFIDENCE, alpha: float = 0.05,
            interval: bool = True) -> Comparison:
    """Model b against model a on the tasks both answered (each task's mean reward over its samples). Without
    `interval`, no bootstrap (low and high None): the difference and the test only, for the domains a page does
    not show."""
    shared = sorted(set(a) & set(b))
    shared = [task for task in shared if len(a[task]) and len(b[task])]
    if not shared:
        return Comparison(0, None, None, None, 0, 0, None)
    mean_a = np.array([np.mean(a[task]) for task in shared])
    mean_b = np.array([np.mean(b[task]) for task in shared])
    differences = mean_b - mean_a
    low = high = None
    if interval:
        draws = _bootstrap_means(differences, np.random.default_rng(seed), samples)
        tail = (1 - confidence) / 2 * 100
        low, high = (float(x) for x in np.percentile(draws, [tail, 100 - tail]))
    # McNemar on pass/fail per task (a task passes when its mean reward passes): exact, on the discordant pairs.
    passed_a, passed_b = mean_a >= PASS, mean_b >= PASS
    a_only, b_only = int(np.sum(passed_a & ~passed_b)), int(np.sum(~passed_a & passed_b))
    p_value = float(stats.binomtest(b_only, a_only + b_only, 0.5).pvalue) if a_only + b_only else 1.0
    return Comparison(len(shared), float(differences.mean()), low, high, a_only, b_only, p_value,
                      q_value=p_value, significant=p_value < alpha)


def adjust(comparisons: Mapping[str, Comparison], *, alpha: float = 0.05) -> dict[str, Comparison]:
    """Benjamini-Hochberg over a family (a comparison per domain): q-values, and significance at `alpha`."""
    keys = [key for key, c in comparisons.items() if c.p_value is not None]
    if not keys:
        return dict(comparisons)
    q_values = stats.false_discovery_control([comparisons[key].p_value for key in keys], method="bh")
    adjusted = dict(comparisons)
    for key, q in zip(keys, q_values, strict=True):
        c = comparisons[key]
        adjusted[key] = Comparison(c.tasks, c.difference, c.low, c.high, c.a_only, c.b_only, c.p_value,
                                   q_value=float(q), significant=bool(q < alpha))
    return adjusted


def tied_groups(scores: Mapping[str, Score]) -> list[list[str]]:
    """Models in order of score, grouped: each group holds the best model left and every model whose interval
    reaches its lower bound (they cannot be told apart from it)."""
    ranked = sorted((name for name, s in scores.items() if s.mean is not None), key=lambda n: -scores[n].mean)
    groups: list[list[str]] = []
    while ranked:
        leader = scores[ranked[0]]
        floor = leader.low if leader.low is not None else leader.mean
        group = [name for name in ranked if (scores[name].high if scores[name].high is not None
                                              else scores[name].mean) >= floor]
        groups.append(group)
        ranked = [name for name in ranked if name not in group]
    return groups


def minimum_detectable_difference(tasks: int, *, base_rate: float = 0.5, discordance: float | None = None,
                                  alpha: float = 0.05, power: float = 0.8) -> float | None:
    """The smallest difference in pass rate a paired comparison on `tasks` tasks detects with `power` at `alpha`
    (two-sided), by the normal approximation to McNemar's test: with a share `discordance` of discordant tasks
    (default: what independent models at `base_rate` would give, 2p(1-p)), a difference d is detected when
    d * sqrt(n) / sqrt(discordance) >= z(1 - alpha/2) + z(power)."""
    if tasks < 1:
        return None
    share = discordance if discordance is not None else 2 * base_rate * (1 - base_rate)
    z = stats.norm.ppf(1 - alpha / 2) + stats.norm.ppf(power)
    return float(min(1.0, z * math.sqrt(share / tasks)))

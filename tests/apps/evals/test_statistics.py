"""The leaderboard's statistics, against values computed by hand or by their definition."""

import math

import numpy as np
import pytest

from apps.evals.statistics import (
    adjust,
    compare,
    minimum_detectable_difference,
    pass_at_k,
    pass_hat_k,
    score,
    tied_groups,
    wilson,
)


def test_wilson_by_hand():
    # 8 of 10 at 95%: centre (0.8 + 1.96²/20) / (1 + 1.96²/10) and half-width as in Wilson (1927).
    z = 1.959963984540054
    centre = (0.8 + z * z / 20) / (1 + z * z / 10)
    half = z * math.sqrt(0.8 * 0.2 / 10 + z * z / 400) / (1 + z * z / 10)
    assert wilson(8, 10) == pytest.approx((centre - half, centre + half))
    low, high = wilson(0, 20)
    assert low == 0.0 and 0.1 < high < 0.2  # never below 0, and not a zero-width interval at 0


def test_pass_at_k_and_pass_hat_k_by_definition():
    # 5 samples, 2 correct: pass@2 = 1 - C(3,2)/C(5,2) = 0.7; pass^2 = C(2,2)/C(5,2) = 0.1.
    assert pass_at_k(5, 2, 2) == pytest.approx(0.7)
    assert pass_hat_k(5, 2, 2) == pytest.approx(0.1)
    assert pass_at_k(5, 0, 3) == 0.0 and pass_at_k(5, 3, 3) == 1.0


def test_a_proportion_gets_wilson_and_samples_per_task_a_clustered_bootstrap():
    plain = score({f"t{i}": [float(i < 30)] for i in range(40)})
    assert plain.method == "wilson" and plain.mean == 0.75 and (plain.low, plain.high) == wilson(30, 40)
    # 20 tasks x 4 samples, each task all-pass or all-fail: the samples of a task are one observation. A
    # bootstrap that resampled the 80 samples as independent would give an interval half as wide.
    clustered = score({f"t{i}": [float(i % 2)] * 4 for i in range(20)})
    assert clustered.method == "bootstrap over tasks" and clustered.tasks == 20 and clustered.samples == 80
    width = clustered.high - clustered.low
    naive = 2 * 1.96 * math.sqrt(0.25 / 80)
    assert width > 1.5 * naive
    assert clustered.pass_at_k[4] == pytest.approx(0.5) and clustered.pass_hat_k[4] == pytest.approx(0.5)


def test_a_paired_comparison_finds_a_real_difference_and_not_noise():
    rng = np.random.default_rng(1)
    a = {f"t{i}": [float(rng.random() < 0.5)] for i in range(300)}
    better = {task: [1.0 if rewards[0] == 1.0 or rng.random() < 0.4 else 0.0] for task, rewards in a.items()}
    found = compare(a, better)
    assert found.significant and found.verdict == "b better" and found.low > 0
    assert found.a_only == 0 and found.b_only > 40 and found.p_value < 1e-6
    shuffled = {task: [float(rng.random() < 0.5)] for task in a}
    noise = compare(a, shuffled)
    assert noise.low < 0 < noise.high or not noise.significant
    assert compare({"x": [1.0]}, {"y": [1.0]}).verdict == "no shared tasks"


def test_mcnemar_exact_by_hand():
    # 10 discordant pairs, 9 favouring b: two-sided exact binomial p = 2 * (C(10,9) + C(10,10)) / 2^10.
    a = {f"t{i}": [0.0 if i < 9 else 1.0] for i in range(10)}
    b = {f"t{i}": [1.0 if i < 9 else 0.0] for i in range(10)}
    assert compare(a, b).p_value == pytest.approx(2 * 11 / 1024)


def test_benjamini_hochberg_across_domains():
    a = {f"t{i}": [0.0] for i in range(10)}
    strong = compare(a, {f"t{i}": [1.0] for i in range(10)})  # p = 2/1024
    weak = compare(a, {f"t{i}": [1.0 if i < 6 else 0.0] for i in range(10)})  # p = 2/64
    adjusted = adjust({"arithmetic": strong, "coding": weak})
    # BH: sorted p (0.00195, 0.03125) -> q = (min(0.00195*2/1, 0.03125), 0.03125*2/2)
    assert adjusted["arithmetic"].q_value == pytest.approx(2 * 2 / 1024)
    assert adjusted["coding"].q_value == pytest.approx(2 / 64)
    assert adjusted["arithmetic"].significant and adjusted["coding"].significant
    assert not adjust({"arithmetic": strong, "coding": weak}, alpha=0.01)["coding"].significant


def test_overlapping_intervals_are_tied_groups():
    from apps.evals.statistics import Score

    scores = {"a": Score(0.80, 0.75, 0.85, 100, 100, "wilson"), "b": Score(0.78, 0.72, 0.83, 100, 100, "wilson"),
              "c": Score(0.50, 0.45, 0.55, 100, 100, "wilson")}
    assert tied_groups(scores) == [["a", "b"], ["c"]]


def test_the_minimum_detectable_difference_shrinks_with_the_suite():
    small, large = minimum_detectable_difference(100), minimum_detectable_difference(1600)
    assert small == pytest.approx(4 * large)  # 1 / sqrt(n)
    # 100 tasks, p = 0.5: sqrt(0.5 / 100) * (1.96 + 0.84) = 0.198
    assert small == pytest.approx(0.198, abs=0.001)

"""`manage.py bench memory`'s figure of growth: per 100 steps, after the warm-up, whatever the warm-up did."""

import pytest

from apps.operations.benchmarks.memory import growth


def test_growth_is_the_slope_after_the_warmup_per_100_steps_in_percent():
    warmup = [{"step": step, "rss_mb": 2500.0 - step} for step in range(0, 50, 5)]  # pages and caches filling up
    after = [{"step": step, "rss_mb": 1000.0 + 0.5 * (step - 50)} for step in range(50, 201, 10)]
    figures = growth(warmup + after, warmup_steps=50)
    assert figures["rss_mb_after_warmup"] == 1000.0
    assert figures["growth_per_100_steps_percent"] == pytest.approx(5.0)


def test_no_growth_is_claimed_from_a_single_step_after_the_warmup():
    samples = [{"step": 10, "rss_mb": 900.0}, {"step": 50, "rss_mb": 950.0}, {"step": 50, "rss_mb": 990.0}]
    assert growth(samples, warmup_steps=50) == {"rss_mb_after_warmup": 950.0, "growth_per_100_steps_percent": None}

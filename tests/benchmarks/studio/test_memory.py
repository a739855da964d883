"""`manage.py bench memory`'s figure of growth: per 100 steps, after the warm-up, whatever the warm-up did, of what
the process keeps (the floor of each 10-step window), not of the working set a sample happened to catch."""

import pytest

from benchmarks.studio.memory import growth


def test_growth_is_the_slope_after_the_warmup_per_100_steps_in_percent():
    warmup = [{"step": step, "rss_mb": 2500.0 - step} for step in range(0, 50, 5)]  # pages and caches filling up
    after = [{"step": step, "rss_mb": 1000.0 + 0.5 * (step - 50)} for step in range(50, 201, 10)]
    figures = growth(warmup + after, warmup_steps=50)
    assert figures["rss_mb_after_warmup"] == 1000.0
    assert figures["growth_per_100_steps_percent"] == pytest.approx(5.0)
    assert figures["growth_all_samples_per_100_steps_percent"] == pytest.approx(5.0)


def test_growth_follows_the_floor_and_not_the_transient_working_set_of_a_sample():
    flat = [{"step": step, "rss_mb": 800.0} for step in range(50, 201, 2)]
    # A generation's or a page's working set caught by the last samples (as at the end of a demo run): freed again.
    spikes = [{"step": step, "rss_mb": 1100.0} for step in range(181, 201, 4)]
    figures = growth(flat + spikes, warmup_steps=50)
    assert figures["growth_per_100_steps_percent"] == pytest.approx(0.0)
    assert figures["growth_all_samples_per_100_steps_percent"] > 5
    # The run's last window holds one sample, at its end, taken while the end-of-run evaluation generates.
    ended = growth(flat + [{"step": 201, "rss_mb": 1100.0}], warmup_steps=50)
    assert ended["growth_per_100_steps_percent"] == pytest.approx(0.0)
    leaking = [{"step": step, "rss_mb": 800.0 + 0.8 * (step - 50)} for step in range(50, 201, 2)]
    assert growth(leaking + spikes, warmup_steps=50)["growth_per_100_steps_percent"] == pytest.approx(10.0)


def test_no_growth_is_claimed_from_a_single_step_after_the_warmup():
    samples = [{"step": 10, "rss_mb": 900.0}, {"step": 50, "rss_mb": 950.0}, {"step": 50, "rss_mb": 990.0}]
    assert growth(samples, warmup_steps=50) == {"rss_mb_after_warmup": 950.0, "growth_per_100_steps_percent": None,
                                                "growth_all_samples_per_100_steps_percent": None}

"""`manage.py bench domains` at a small size: every measure answers, and what must not grow with the number of
domains does not — the queries of publishing, resolving, pinning and exporting a bundle, a step's live message —
while a step's per-domain points stay bounded by the domains the step drew."""

import pytest

from benchmarks.studio.domains import BASELINE, Workload, run

SMALL = Workload(scheduler_steps=10, overhead_steps=3, run_steps=3, run_groups=6, page_repeats=1, large_step=12)


@pytest.mark.django_db
def test_bench_domains_measures_every_size_with_what_does_not_grow_with_the_domains():
    figures = run(domains=[26], workload=SMALL)
    small, large = figures["sizes"][str(BASELINE)], figures["sizes"]["26"]
    for name in ("bundle_publish", "closure", "pin", "export"):
        assert large[name]["queries"] == small[name]["queries"], (name, small[name], large[name])
    assert large["publish"]["queries"] > small["publish"]["queries"]  # the domains themselves: one publish each
    for sizes in (small, large):
        page = sizes["run_page"]
        assert 0 < page["domain_points_per_step"] <= SMALL.run_groups
        assert page["page"]["bytes"] > 0 and page["domains_endpoint"]["bytes"] > 0
        assert sizes["leaderboard"]["page"]["bytes"] > 0
        assert set(sizes["scheduler"]) == set(sizes["step_overhead"]) == {"groups_8", "groups_12"}
        assert sizes["scheduler"]["groups_12"]["tasks_observed"] > 0
    assert large["run_page"]["live_update_bytes"] <= small["run_page"]["live_update_bytes"] + 16
    assert set(figures["targets"]) == {"domains", "scheduler_p95_ms_under_5", "run_page_server_ms_under_1000",
                                       "live_update_no_larger_than_at_10"}

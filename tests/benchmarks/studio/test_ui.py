"""`manage.py bench ui`'s trajectory list at a small size on PostgreSQL: every page answers, and the pages that an
index serves in order read only their own rows. The plan, not the time, is what is checked: a page walking the
wrong index costs 10x at a million rows and nothing measurable at twenty thousand, while the rows it reads show
it at any size."""

import pytest

from apps.trajectories.models import Trajectory
from apps.trajectories.selectors import PAGE_SIZE
from benchmarks.studio.ui import trajectory_list_times

# Ten runs of 2,000 rows: large enough that PostgreSQL walks indexes rather than sorting a scan, as it does at a
# million rows. Before trajectories/0003, the first page of one run walked the project's newest-first index in
# about half of these tests (the runs' random ids decide), reading the 12,000 rows of the newer runs first.
TRAJECTORIES = 20_000


@pytest.mark.postgres
@pytest.mark.django_db
def test_each_page_reads_only_its_own_rows():
    figures = trajectory_list_times(trajectories=TRAJECTORIES, repeats=1)
    pages = figures["pages"]
    assert all(page["rows"] == PAGE_SIZE for name, page in pages.items() if name not in (
        "rare_status_infra_error", "timeouts_of_one_run", "one_task")), pages
    for name, index in (("one_run", "trajectory_project_run_recent"), ("one_run_deep", "trajectory_project_run_recent"),
                        ("reward_high_of_one_run", "trajectory_project_run_reward")):  # the filter most pages use
        assert pages[name]["plan"]["indexes"] == [index], (name, pages[name]["plan"])
    for name in ("first_page", "page_at_row_500000", "one_run", "one_run_deep", "reward_high",
                 "reward_high_of_one_run", "slowest"):
        assert pages[name]["plan"]["rows_read"] <= PAGE_SIZE + 2, (name, pages[name]["plan"])
    assert not Trajectory.objects.exists()  # generated in a transaction that is rolled back

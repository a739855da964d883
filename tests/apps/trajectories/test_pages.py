"""Trajectory pages without a browser: keyset pages that visit every row once in order, filters that narrow
the list."""

from django.urls import reverse

from apps.trajectories.models import Trajectory
from apps.trajectories.selectors import SORTS, trajectory_page


def test_keyset_pages_visit_every_row_once_in_order_for_every_sort(project, studio_run):
    run, _ = studio_run
    total = Trajectory.objects.filter(project=project).count()
    for sort, (column, descending, _) in SORTS.items():
        seen, after = [], ""
        while True:
            page = trajectory_page(project=project, sort=sort, after=after, limit=7)
            seen += page.rows
            if not page.next_cursor:
                break
            after = page.next_cursor
        expected = Trajectory.objects.filter(project=project)
        if column == "reward":
            expected = expected.filter(reward__isnull=False)
        assert len(seen) == expected.count() == total, sort
        assert len({t.pk for t in seen}) == len(seen), sort
        keys = [getattr(t, column) for t in seen]
        assert keys == sorted(keys, reverse=descending), sort


def test_filters_narrow_the_list(client, owner, project, studio_run):
    run, _ = studio_run
    client.force_login(owner)
    url = reverse("trajectories:trajectory_list", kwargs={"project": project.slug})
    page = client.get(url, {"domain": "3d-modelling", "template": "task_template/primitive-solids"})
    assert page.content.count(b"data-trajectory=") == 30
    assert client.get(url, {"status": "timeout"}).content.count(b"data-trajectory=") == 0
    high = client.get(url, {"reward_min": "0.5", "verifier": "verifier/numeric-exact"}).context["page"].rows
    low = client.get(url, {"reward_max": "0.5"}).context["page"].rows
    assert high and low and min(t.reward for t in high) >= 0.5 and max(t.reward for t in low) <= 0.5
    assert {t.verifier.split("@")[0] for t in high} == {"verifier/numeric-exact"}
    assert client.get(url, {"after": "not-a-cursor"}).status_code == 400

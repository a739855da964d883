"""The replay shows a repair trajectory's loop as a chain: the failing test run's output, the edit's diff, the
passing run's output, in that order, each linked to its turn; a trajectory that neither tests nor edits has none."""

from django.urls import reverse

from apps.runs.services import run_create
from apps.trajectories.services import trajectories_record
from tests.support.repair import FIX, PASSING, bash, editor, planted, run_tests, submit
from workers.rl.types import trajectory_id


def _page(client, project, trajectory) -> str:
    return client.get(reverse("trajectories:trajectory_detail", kwargs={
        "project": project.slug, "trajectory_id": trajectory.id})).content.decode()


def test_the_replay_shows_the_failing_run_the_edit_and_the_passing_run_in_order(client, owner, project, registry):
    run = run_create(project=project, bundle=registry["bundle"], steps=1, actor=owner)
    ids = {seq: dict(id=trajectory_id(str(run.pk), seq, 0), run_id=str(run.pk), seq=seq) for seq in range(3)}
    failing = bash("python -m pytest -q 2>&1 | tail -3", "E   AssertionError: add(1, 2) returned -1, expected 3\n"
                                                         "1 failed, 2 passed in 0.05s")
    fixed = planted(failing, editor("view"), editor("str_replace", diff=FIX), run_tests(0), submit(), **ids[0])
    gave_up = planted(run_tests(1), submit(), reward=0.0, **ids[1])
    arithmetic = planted(reward=1.0, said="42", **ids[2])
    trajectories_record(run=run, attempt=1, trajectories=[fixed, gave_up, arithmetic])
    client.force_login(owner)

    page = _page(client, project, fixed)
    section = page[page.index("data-repair"):page.index('<ol class="turns">')]
    assert 'data-repair-outcome="fixed_by_feedback"' in page and "fixed by feedback</span>" in section
    # Three steps (the view is no edit), all three the fix's and open, in turn order: test, edit, test.
    steps = section.split('<li class="repair-step')[1:]
    assert [step.split('data-repair-step="')[1].split('"')[0] for step in steps] == ["test", "edit", "test"]
    assert all(" in-chain" in step and "<details open>" in step for step in steps)
    assert [step.split('data-turn="')[1].split('"')[0] for step in steps] == ["3", "7", "9"]
    assert '<a href="#turn-3">turn 3</a>' in steps[0] and "tests failed" in steps[0]
    assert "add(1, 2) returned -1, expected 3" in steps[0] and "1 failed, 2 passed in 0.05s" in steps[0]
    assert "+    return a + b" in steps[1] and "<b>edit</b>" in steps[1]
    assert "tests passed" in steps[2] and PASSING in steps[2]
    assert "A test run failed (turn 3), an edit answered it (turn 7) and a later run passed (turn 9)" in section

    page = _page(client, project, gave_up)
    assert 'data-repair-outcome="gave_up"' in page and "No failing test run was followed by an edit" in page
    assert page.count('<li class="repair-step') == 1 and " in-chain" not in page
    assert "data-repair" not in _page(client, project, arithmetic)

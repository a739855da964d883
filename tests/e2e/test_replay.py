"""Trajectory replay in a real browser: a coding trajectory's code, sandbox output and unit-test verdict; a 3D
trajectory's screenshot; keyboard navigation, the permalink, and two trajectories side by side."""

import pytest

from apps.trajectories.models import Trajectory

pytestmark = pytest.mark.browser


def _coding(run):
    return Trajectory.objects.filter(run=run, domain="python-coding").order_by("seq").first()


def test_replay_shows_code_sandbox_output_and_the_unit_test_verdict(page_as, live_url, project, owner, studio_run,
                                                                    screenshot):
    run, _ = studio_run
    trajectory = _coding(run)
    page = page_as(owner)
    page.goto(f"{live_url}/p/{project.slug}/trajectories/{trajectory.pk}/")
    assert "def running_max(xs):" in page.locator(".tool-call pre.code-block").first.inner_text()
    assert page.locator("pre.stdout").first.inner_text().strip() == "[1, 3, 3]"
    assert "TypeError: 'NoneType' object is not iterable" in page.locator("pre.stderr").first.inner_text()
    verdict = page.locator("[data-verdict]")
    assert "unit_tests" in verdict.inner_text() and "tests passed" in verdict.inner_text()
    # The model's output, one span a token of the run's own tokenizer, which together spell what it wrote.
    spans = page.eval_on_selector(".tokens", "el => Array.from(el.querySelectorAll('.tok'), s => s.textContent)")
    first_answer = next(t for t in trajectory.turns if t["role"] == "assistant")
    assert len(spans) == len(first_answer["token_ids"]) > 10
    assert "".join(spans) == first_answer["content"]
    page.wait_for_selector(".timeline .main-svg")
    screenshot(page, "replay_coding")


def test_keyboard_steps_through_turns_and_the_permalink_reopens_the_same_turn(page_as, live_url, project, owner,
                                                                                studio_run):
    run, _ = studio_run
    trajectory = _coding(run)
    page = page_as(owner)
    url = f"{live_url}/p/{project.slug}/trajectories/{trajectory.pk}/"
    page.goto(url)
    assert page.locator(".turn.current").get_attribute("data-step") == "0"
    for _ in range(3):
        page.keyboard.press("j")
    page.keyboard.press("k")
    assert page.locator(".turn.current").get_attribute("data-step") == "2"
    assert page.url.endswith("#turn-2")
    assert page.locator(".turn.current .badge.role").inner_text().startswith("model")

    page.goto("about:blank")
    page.goto(url + "#turn-3")  # the permalink
    assert page.locator(".turn.current").get_attribute("data-step") == "3"
    assert page.locator(".turn.current .badge.role").inner_text() == "tool run_python"

    page.select_option("[data-colour-mode]", "logprob")
    assert page.locator("[data-replay]").get_attribute("data-colour") == "logprob"
    page.keyboard.press("c")
    assert page.locator("[data-replay]").get_attribute("data-colour") == "none"

    following = Trajectory.objects.filter(run=run, seq=trajectory.seq + 1, sample=0).get()
    page.keyboard.press("]")
    page.wait_for_url(f"**/trajectories/{following.pk}/#turn-3")
    page.keyboard.press("[")
    page.wait_for_url(f"**/trajectories/{trajectory.pk}/#turn-3")


def test_a_3d_trajectory_shows_its_rendered_screenshot(page_as, live_url, project, owner, studio_run, screenshot):
    run, _ = studio_run
    trajectory = Trajectory.objects.filter(run=run, domain="3d-modelling").order_by("seq").first()
    page = page_as(owner)
    page.goto(f"{live_url}/p/{project.slug}/trajectories/{trajectory.pk}/")
    image = page.locator(".artifacts img").first
    image.wait_for()
    page.wait_for_function("img => img.complete && img.naturalWidth > 0", arg=image.element_handle())
    assert image.get_attribute("alt") == "geometry/solid/iso.png"
    screenshot(page, "replay_3d")


def test_two_trajectories_of_the_same_task_side_by_side_step_together(page_as, live_url, project, owner, studio_run,
                                                                       screenshot):
    run, _ = studio_run
    first, second = Trajectory.objects.filter(run=run, domain="python-coding").order_by("seq")[:2]
    page = page_as(owner)
    page.goto(f"{live_url}/p/{project.slug}/trajectories/{first.pk}/")
    page.locator("[data-side-by-side]").first.click()
    page.wait_for_url("**/vs/**")
    assert page.locator("[data-replay]").count() == 2
    page.keyboard.press("j")
    assert page.locator(".turn.current").count() == 2
    assert {page.locator(".turn.current").nth(i).get_attribute("data-step") for i in range(2)} == {"1"}
    screenshot(page, "replay_side_by_side")


def test_the_trajectory_browser_pages_and_opens_a_replay(page_as, live_url, project, owner, studio_run, screenshot):
    run, _ = studio_run  # 30 steps x 3 trajectories: two pages of 50
    page = page_as(owner)
    page.goto(f"{live_url}/p/{project.slug}/trajectories/?run={run.pk}")
    assert page.locator("tr[data-trajectory]").count() == 50
    screenshot(page, "trajectory_list")
    first_page = set(page.eval_on_selector_all("tr[data-trajectory]", "rows => rows.map(r => r.dataset.trajectory)"))
    page.get_by_text("Next page →").click()
    second_page = set(page.eval_on_selector_all("tr[data-trajectory]", "rows => rows.map(r => r.dataset.trajectory)"))
    assert len(second_page) == 40 and not first_page & second_page
    page.locator("tr[data-trajectory] td a").first.click()
    page.wait_for_selector("[data-replay]")

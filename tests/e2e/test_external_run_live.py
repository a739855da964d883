"""The page of a run trained elsewhere in a real browser: its charts drawn by the trainer's step from the history, an
episode its trainer plays appears live, and Finish ends it (the live dot goes grey, the buttons go)."""

import pytest

from apps.registry.pins import bundle_tasks
from apps.runs.external import external_run, record_episode
from tests.support.episodes import episode

pytestmark = [pytest.mark.browser, pytest.mark.postgres]

TRACE_X = """name => { const panel = document.querySelector('[data-panel="reward"]');
  const trace = panel && panel.data.find(t => t.meta === name); return trace ? trace.x : null; }"""


def test_an_episode_played_elsewhere_appears_live_and_finish_ends_the_run(page_as, live_url, project, owner, registry,
                                                                          screenshot):
    tasks = bundle_tasks(bundle=registry["bundle"])
    run = external_run(project=project, name="verl-elsewhere", bundle_version=registry["bundle"], user=owner,
                       client="verl", model="Qwen/Qwen3-0.6B")
    for answer, step in (("6", 1), ("7", 1), ("8", 2)):
        record_episode(run, episode(tasks, "add-00003", answer), trainer_step=step)
    page = page_as(owner)
    page.goto(f"{live_url}/p/{project.slug}/runs/{run.pk}/")
    page.wait_for_function("() => window.studioLive && window.studioLive.connected")
    page.wait_for_function(f"() => ({TRACE_X})('reward/mean') && ({TRACE_X})('reward/mean').length === 2")
    assert page.evaluate(TRACE_X, "reward/mean") == [1, 2]  # by the trainer's step

    record_episode(run, episode(tasks, "add-00004", "8", tool=True), trainer_step=5)
    page.wait_for_function("() => window.studioLive.rendered.some(r => r.step === 5)", timeout=5000)
    assert page.locator("[data-step]").first.inner_text() == "5"  # no progress bar to move: no known end
    screenshot(page, "external_run_page")

    page.get_by_role("button", name="Finish").click()
    page.get_by_text("Finished: its trainer's next episodes are refused.").wait_for()
    page.wait_for_function("() => document.querySelector('[data-live-state]').textContent === 'ended'")
    assert not page.get_by_role("button", name="Finish").is_visible()

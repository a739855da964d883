"""The Dash explorer under the studio's URL and login: its figures render, its callbacks pass our CSRF check."""

import pytest

pytestmark = pytest.mark.browser


def test_the_explorer_renders_and_filters_a_run(page_as, live_url, project, owner, studio_run, screenshot):
    run, _ = studio_run
    page = page_as(owner)
    page.goto(f"{live_url}/p/{project.slug}/explore/?run={run.pk}")
    page.wait_for_function("() => document.querySelectorAll('.js-plotly-plot').length === 5")
    summary = page.locator("#summary")
    page.wait_for_function("() => document.querySelector('#summary').innerText.startsWith('90 trajectories')")
    # A filter runs a callback (a POST with Django's CSRF token) and every figure follows it.
    page.locator("#status").click()
    page.get_by_role("option", name="timeout", exact=True).click()
    page.wait_for_function("() => document.querySelector('#summary').innerText === 'No trajectories match.'")
    assert "No trajectories match." in summary.inner_text()
    page.get_by_role("option", name="timeout", exact=True).click()
    page.keyboard.press("Escape")
    page.wait_for_function("() => document.querySelector('#summary').innerText.startsWith('90 trajectories')")
    page.wait_for_selector("#reward-hist .bars, #reward-hist .trace.bars")
    screenshot(page, "explorer")

"""The run page in a real browser: history first, then points a worker writes appear within a second; a dropped
socket reconnects and fetches only the steps it missed; a constant series stays flat under smoothing; the live dot
goes grey when the run ends."""

import time

import pytest
from playwright.sync_api import expect

from apps.runs.services import run_finish, run_step_record

pytestmark = pytest.mark.browser

LAST_X = """name => { const panel = document.querySelector('[data-panel="reward"]');
  const trace = panel.data.find(t => t.meta === name); return trace ? trace.x : null; }"""


def _open(page, live_url, project, run):
    requests = []
    page.on("request", lambda request: requests.append(request.url))
    page.goto(f"{live_url}/p/{project.slug}/runs/{run.pk}/")
    page.wait_for_function("() => window.studioLive && window.studioLive.connected")
    page.wait_for_function("() => document.getElementById('run-live').dataset.lastStep === '30'")
    return requests


def test_a_metric_written_by_a_worker_appears_on_the_run_page_within_a_second(page_as, live_url, project, owner,
                                                                              studio_run, screenshot):
    run, attempt = studio_run
    page = page_as(owner)
    _open(page, live_url, project, run)
    assert page.evaluate(LAST_X, "reward/mean")[-1] == 30  # the history came from the JSON endpoint

    written = time.time()
    run_step_record(run_id=run.pk, attempt=attempt, step=31, wall_time=written, trajectories=[],
                    points={"reward/mean": 0.91, "reward/new-domain": 0.4, "idle/generation": 0.2},
                    events=[("retry", "sandbox restarted", {})])
    page.wait_for_function("() => window.studioLive.rendered.some(r => r.step === 31)", timeout=2000)
    shown_at = page.evaluate("window.studioLive.rendered.find(r => r.step === 31).at") / 1000
    assert shown_at - written < 1.0, f"visible {shown_at - written:.3f} s after the write"
    assert page.evaluate(LAST_X, "reward/mean")[-1] == 31
    # A domain's reward is in no trace: a domain the page had not seen joins the domains' table once the page reads
    # it again (the step's message said it wrote a domain's point; the page reads at most every few seconds).
    assert page.evaluate("document.querySelector('[data-panel=\"reward\"]').data.map(t => t.meta)") == ["reward/mean"]
    page.locator('#run-domains tr[data-domain="new-domain"]').wait_for(timeout=8000)
    page.get_by_text("sandbox restarted").wait_for()
    # A panel out of view is not redrawn until it scrolls into view; then it shows every step.
    trainer_steps = "document.querySelector('[data-panel=\"ns-trainer\"]').data[0].x.length"
    assert page.evaluate(trainer_steps) == 0
    page.locator('[data-panel="ns-trainer"]').scroll_into_view_if_needed()
    page.wait_for_function(f"() => {trainer_steps} === 30", timeout=2000)
    screenshot(page, "run_page")


def test_a_reconnect_fetches_only_what_it_missed(page_as, live_url, project, owner, studio_run):
    run, attempt = studio_run
    page = page_as(owner)
    requests = _open(page, live_url, project, run)
    page.evaluate("window.studioLive.dropSocket()")
    page.wait_for_function("() => !window.studioLive.connected")
    for step in (31, 32):  # written while the page has no socket (it waits half a second to reconnect)
        run_step_record(run_id=run.pk, attempt=attempt, step=step, wall_time=time.time(), trajectories=[],
                        points={"reward/mean": 0.5 + step / 100})
    page.wait_for_function("() => window.studioLive.connected && "
                           "document.getElementById('run-live').dataset.lastStep === '32'")
    steps = page.evaluate(LAST_X, "reward/mean")
    assert steps == list(range(1, 33))  # every step once: nothing missed, nothing twice
    history = [url for url in requests if "history.json" in url]
    assert "after_step" not in history[0] and "after_step=30" in history[-1]  # first from the start, then after


def test_a_reload_shows_the_evaluation_at_step_0(page_as, live_url, project, owner, studio_run):
    """The start-of-run evaluation is recorded at step 0, before the first training step: a page opened later
    shows it."""
    run, attempt = studio_run
    run_step_record(run_id=run.pk, attempt=attempt, step=0, wall_time=time.time(), trajectories=[],
                    points={"eval/reward/arithmetic": 0.25})
    page = page_as(owner)
    _open(page, live_url, project, run)
    # A domain's evaluation is in its row of the domains' table (a run of a thousand domains would draw a thousand
    # traces), from the start of the run to its latest: one evaluation, so 0.25 both ways.
    row = page.locator('#run-domains tr[data-domain="arithmetic"]')
    row.scroll_into_view_if_needed()
    expect(row.locator("td").last).to_have_text("0.25 → 0.25")
    assert page.locator('[data-panel="ns-eval"]').count() == 0


def test_a_constant_series_is_drawn_flat_under_smoothing(page_as, live_url, project, owner, studio_run):
    """An SFT run's constant learning rate (3e-4): smoothed, as every chart is by default, each point stays 3e-4. The
    moving average that summed and divided rounded it into values 1e-20 apart, which Plotly's axis spread over the
    whole chart: a saw-tooth."""
    run, attempt = studio_run
    for step in range(31, 41):
        run_step_record(run_id=run.pk, attempt=attempt, step=step, wall_time=time.time(), trajectories=[],
                        points={"optimizer/learning_rate": 3e-4})
    page = page_as(owner)
    page.goto(f"{live_url}/p/{project.slug}/runs/{run.pk}/")
    panel = page.locator('[data-panel="learning_rate"]')
    panel.scroll_into_view_if_needed()  # a panel is drawn once in view
    drawn = """() => document.querySelector('[data-panel="learning_rate"]').data[0].y"""
    page.wait_for_function(f"() => ({drawn})().length === 10")
    assert page.evaluate("document.querySelector('[data-smoothing]').value") == "0.6"
    assert page.evaluate(drawn) == [3e-4] * 10


def test_the_x_axis_switches_to_wall_time_and_controls_follow_the_status(page_as, live_url, project, owner,
                                                                           studio_run):
    run, _ = studio_run
    page = page_as(owner)
    _open(page, live_url, project, run)
    page.select_option("[data-x-axis]", "wall_time")
    page.wait_for_function("() => document.querySelector('[data-panel=\"reward\"]').layout.xaxis.type === 'date'")
    assert page.locator("button[value=pause]").is_visible()
    assert not page.locator("button[value=resume]").is_visible()
    page.locator("button[value=pause]").click()
    page.get_by_text("Pause requested.").wait_for()
    run.refresh_from_db()
    assert run.requested == "pause"


def test_the_live_dot_says_ended_when_the_run_ends_while_the_page_is_open(page_as, live_url, project, owner,
                                                                         studio_run):
    run, attempt = studio_run
    page = page_as(owner)
    _open(page, live_url, project, run)
    dot = page.locator("[data-live-state]")
    expect(dot).to_have_text("live")
    expect(dot).to_have_class("live-state on")
    run_finish(run_id=run.pk, attempt=attempt, status="completed")  # the worker's last word, over the socket
    expect(dot).to_have_text("ended")
    expect(dot).to_have_class("live-state ended")
    expect(dot).to_have_attribute("title", "no live updates: the run is completed")
    expect(page.locator("h1 .badge")).to_have_text("completed")
    # Opened after the end, the page says so from the start, and its socket connecting does not make it live.
    page.reload()
    page.wait_for_function("() => window.studioLive && window.studioLive.connected")
    expect(dot).to_have_text("ended")
    expect(dot).to_have_class("live-state ended")


def test_a_member_of_another_project_gets_nothing_in_the_browser(page_as, live_url, project, outsider, studio_run):
    run, attempt = studio_run
    page = page_as(outsider)
    response = page.goto(f"{live_url}/p/{project.slug}/runs/{run.pk}/")
    assert response.status == 404 and "live-run" not in page.content()
    assert page.goto(f"{live_url}/p/{project.slug}/runs/{run.pk}/history.json").status == 404
    assert page.goto(f"{live_url}/p/{project.slug}/explore/").status == 404
    page.evaluate("""url => { window.seen = {opened: false, messages: 0, closed: false};
        const socket = new WebSocket(url);
        socket.onopen = () => { window.seen.opened = true; };
        socket.onmessage = () => { window.seen.messages += 1; };
        socket.onclose = () => { window.seen.closed = true; }; }""",
                  live_url.replace("http://", "ws://") + f"/ws/runs/{run.pk}/")
    page.wait_for_function("() => window.seen.closed")
    run_step_record(run_id=run.pk, attempt=attempt, step=31, wall_time=time.time(), trajectories=[],
                    points={"reward/mean": 0.9})
    page.wait_for_timeout(300)
    assert page.evaluate("window.seen") == {"opened": False, "messages": 0, "closed": True}

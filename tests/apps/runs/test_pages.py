"""Run pages without a browser: history downsampled on the server and fetched after a step, starting,
comparing and controlling runs."""

import json
import re

from django.urls import reverse

from apps.accounts.services import project_create
from apps.operations.synthetic import run_synthetic_create, run_synthetic_steps
from apps.runs.models import Run
from apps.runs.selectors import metric_history
from apps.runs.services import run_step_record


def test_history_is_downsampled_on_the_server_and_fetched_after_a_step(client, owner, project, studio_run):
    run, _ = studio_run
    full = metric_history(run=run)
    assert full["bucket"] == 1 and full["series"]["reward/mean"]["step"] == list(range(1, 31))
    coarse = metric_history(run=run, max_points=10)
    assert coarse["bucket"] == 3 and coarse["series"]["reward/mean"]["step"] == list(range(3, 31, 3))
    values = full["series"]["reward/mean"]["value"]
    assert abs(coarse["series"]["reward/mean"]["value"][0] - sum(values[:3]) / 3) < 1e-9  # a bucket's mean
    client.force_login(owner)
    url = reverse("runs:run_history", kwargs={"project": project.slug, "run_id": run.pk})
    body = json.loads(client.get(url + "?after_step=28&after_event=0").content)
    assert body["series"]["reward/mean"]["step"] == [29, 30] and body["last_step"] == 30
    assert [e["kind"] for e in body["events"]][:2] == ["created", "started"]
    last_event = body["events"][-1]["id"]
    assert json.loads(client.get(url + f"?after_step=30&after_event={last_event}").content)["events"] == []


def test_history_from_the_start_holds_the_evaluation_at_step_0_and_after_a_step_does_not(client, owner, project,
                                                                                        studio_run, api_as):
    """The start-of-run evaluation is recorded at step 0: the page's first fetch (no after_step) must bring it, a
    later fetch after a step held must not bring it twice."""
    run, attempt = studio_run
    run_step_record(run_id=run.pk, attempt=attempt, step=0, wall_time=1_700_000_000.0, trajectories=[],
                    points={"eval/reward/arithmetic": 0.25})
    client.force_login(owner)
    url = reverse("runs:run_history", kwargs={"project": project.slug, "run_id": run.pk})
    first = json.loads(client.get(url).content)
    assert first["series"]["eval/reward/arithmetic"] == {"step": [0], "wall_time": [1_700_000_000.0], "value": [0.25]}
    assert first["series"]["reward/mean"]["step"] == list(range(1, 31)) and first["last_step"] == 30
    assert "eval/reward/arithmetic" not in json.loads(client.get(url + "?after_step=0").content)["series"]
    assert metric_history(run=run)["series"]["eval/reward/arithmetic"]["step"] == [0]  # the explorer's, compare's
    metrics = api_as(owner).get(f"/projects/{project.slug}/runs/{run.pk}/metrics", names="eval/reward/arithmetic")
    assert metrics.json()["series"]["eval/reward/arithmetic"]["step"] == [0]


def test_start_a_run_from_the_list_and_compare_two_runs(client, owner, project, registry, studio_run):
    run, _ = studio_run
    client.force_login(owner)
    listing = client.get(reverse("runs:run_list", kwargs={"project": project.slug}))
    url = reverse("runs:run_new", kwargs={"project": project.slug})
    assert f'href="{url}"'.encode() in listing.content  # "Start a run…": the form has a page of its own
    form = client.get(url).context["form"]
    values = {name: form.initial.get(name, field.initial) for name, field in form.fields.items() if not field.disabled}
    data = {name: form.fields[name].prepare_value(value) for name, value in values.items()
            if value is not None and value is not False}  # an unticked checkbox is not sent
    data = {**data, "bundle": registry["bundle"].pk, "steps": 5, "name": "from-the-page", "group_size": 4}
    review = client.post(url, {**data, "action": "review"})
    assert review.status_code == 200 and not Run.objects.filter(name="from-the-page").exists()
    response = client.post(url, {**data, "reviewed": review.context["config_hash"], "action": "queue"})
    started = Run.objects.get(name="from-the-page")
    assert response.status_code == 302 and started.status == "queued" and started.config["group_size"] == 4
    assert client.post(url, {**data, "domain_weights": "[1]", "action": "review"}).status_code == 400
    other = run_synthetic_create(project=project, bundle=registry["bundle"], steps=10, name="second", actor=owner)
    run_synthetic_steps(run=other, steps=3)
    page = client.get(reverse("runs:run_compare", kwargs={"project": project.slug}),
                      {"run": [str(run.pk), str(other.pk)]})
    assert page.status_code == 200
    assert b"~ steps_total" not in page.content  # configs are compared, not the run rows
    assert b"Same bundle, same pinned versions." in page.content
    assert b"Identical configs." in page.content
    figures = json.loads(page.context["figures"][0]["figure"])
    assert [t["meta"] for t in figures["data"]] == [str(run.pk), str(other.pk)]


def test_pause_resume_cancel_from_the_run_page(client, owner, project, registry):
    client.force_login(owner)
    run = run_synthetic_create(project=project, bundle=registry["bundle"], steps=10, actor=owner)
    control = reverse("runs:run_control", kwargs={"project": project.slug, "run_id": run.pk})
    for action, status in (("pause", "paused"), ("resume", "queued"), ("cancel", "cancelled")):
        client.post(control, {"action": action})
        run.refresh_from_db()
        assert run.status == status, action
    page = client.post(control, {"action": "pause"}, follow=True)
    assert b"a cancelled run cannot be paused" in page.content


def test_the_live_dot_says_ended_once_the_run_is_no_longer_queued_or_running(client, owner, project, registry):
    client.force_login(owner)
    run = run_synthetic_create(project=project, bundle=registry["bundle"], steps=10, actor=owner)
    url = reverse("runs:run_detail", kwargs={"project": project.slug, "run_id": run.pk})
    dot = re.compile(r'<span class="live-state([^"]*)" data-live-state\s+title="([^"]*)">([^<]*)</span>')
    assert dot.search(client.get(url).content.decode()).groups() == ("", "live updates", "connecting…")  # queued
    for status, says in (("paused", "paused"), ("completed", "ended"), ("failed", "ended"), ("cancelled", "ended")):
        Run.objects.filter(pk=run.pk).update(status=status)
        shown = dot.search(client.get(url).content.decode()).groups()
        assert shown == (" ended", f"no live updates: the run is {status}", says), status


def test_a_queued_run_says_which_run_holds_its_lane_and_where_it_stands(client, owner, project, registry, studio_run,
                                                                          settings):
    settings.EMBEDDED = True  # the demo: one training lane, which the demo's run holds
    demo, _ = studio_run  # running, at step 30 of 100
    second = run_synthetic_create(project=project, bundle=registry["bundle"], steps=10, name="second", actor=owner)
    # The lane is the studio's, not the project's: another project's run queued before it is counted, not named.
    elsewhere = project_create(team_slug="other-team", slug="elsewhere", name="Elsewhere", owner=owner, via="cli")
    Run.objects.create(project=elsewhere, name="not-named-here", config={}, config_hash="0", steps_total=10)
    third = run_synthetic_create(project=project, bundle=registry["bundle"], steps=10, name="third", actor=owner)
    client.force_login(owner)

    def notice(run) -> str:
        page = client.get(reverse("runs:run_detail", kwargs={"project": project.slug, "run_id": run.pk}))
        found = re.search(r"<div [^>]*data-queue>(.*?)</div>", page.content.decode(), re.S)
        return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", found.group(1))).strip() if found else ""

    said = notice(third)
    assert said.startswith("Queued: number 3 in the training queue, after second (queued), a run of another project "
                           "(queued).") and "not-named-here" not in said, said
    assert ("It waits for live-run (running, step 30 / 100), which holds the training lane: this studio runs one "
            "training run at a time, so this one starts when that one ends or is paused and the runs before it have "
            "had their turn.") in said, said
    assert notice(second).startswith("Queued: number 1 in the training queue. It waits for live-run")
    assert notice(demo) == ""  # running: no queue


def test_compare_leaves_out_ids_that_are_no_runs(client, owner, project, studio_run):
    run, _ = studio_run
    client.force_login(owner)
    url = reverse("runs:run_compare", kwargs={"project": project.slug})
    for ids, shown in ((["not-a-uuid"], []), (["not-a-uuid", str(run.pk), "1' OR '1'='1"], [run]),
                       (["", "00000000-0000-0000-0000-000000000000", str(run.pk)], [run])):
        page = client.get(url, {"run": ids})
        assert page.status_code == 200, (ids, page.content[:300])
        assert page.context["runs"] == shown, ids

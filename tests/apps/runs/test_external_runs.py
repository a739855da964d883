"""Runs trained elsewhere (apps/runs/external.py): episodes a trainer outside the studio played in a bundle's
environments, recorded as trajectories of an `external` run, graded by the bundle's real verifier, and read back
by every page and API that reads ours."""

from __future__ import annotations

import json
import uuid

import pytest
from django.urls import reverse

from apps.datasets.services import dataset_build
from apps.evals import results
from apps.evals.services import EvalError, endpoint_create, evaluation_launch, target_resolve
from apps.registry.dataset_store import dataset_materialise
from apps.registry.pins import bundle_tasks
from apps.registry.services import version_publish
from apps.review.exports import dataset_rows
from apps.review.services import item_next, label_submit, queue_create
from apps.runs.embedded import LANES, train_next_queued
from apps.runs.external import ExternalRunRefused, external_run, record_episode
from apps.runs.models import MetricPoint, Run, RunKind, RunStatus
from apps.runs.services import RunError, run_claim, run_create, run_request, runs_requeue_lost
from apps.trajectories.models import Trajectory as Archived
from tests.support.episodes import episode
from tests.support.specimens import RUBRIC
from workers.rl.types import TrajectoryStatus

pytestmark = pytest.mark.postgres

@pytest.fixture
def tasks(registry):
    return bundle_tasks(bundle=registry["bundle"])


@pytest.fixture
def run(project, registry, owner):
    return external_run(project=project, name="trl-qwen-grpo", bundle_version=registry["bundle"], user=owner,
                        client="trl", model="Qwen/Qwen3-0.6B")


def test_episodes_are_archived_at_the_trainers_steps_with_their_verdicts_and_points(run, tasks, project):
    assert (run.kind, run.status, run.config) == (RunKind.EXTERNAL, RunStatus.RUNNING,
                                                 {"client": "trl", "trainer_model": "Qwen/Qwen3-0.6B"})
    # Step 3: a group of two on one task (right and wrong: signal), and one alone; step 4: one abandoned.
    right = episode(tasks, "add-00003", "6", tool=True)
    wrong = episode(tasks, "add-00003", "7")
    alone = episode(tasks, "add-00004", "8")
    left = episode(tasks, "add-00005", "", status=TrajectoryStatus.ABANDONED)
    for trajectory, step in ((right, 3), (wrong, 3), (alone, 3), (left, 4)):
        record_episode(run, trajectory, trainer_step=step)

    rows = {row.pk: row for row in Archived.objects.filter(run=run)}
    assert {str(pk) for pk in rows} == {right.id, wrong.id, alone.id, left.id}  # the server's ids kept
    kept = rows[uuid.UUID(right.id)]
    assert (kept.step, kept.policy_version, kept.reward, kept.verdict_status, kept.deciding_layer) == \
        (3, 3, 1.0, "pass", "exact")
    assert kept.num_tool_calls == 1 and kept.turns[-2]["result"]["stdout"] == "6\n"
    assert kept.verdict["components"][0]["layer"] == "exact" and kept.task_hash == right.task_hash
    assert rows[uuid.UUID(wrong.id)].reward == 0.0
    # the group of add-00003 at step 3 has reward variance: both effective; alone has no group to compare with
    assert [rows[uuid.UUID(t.id)].effective for t in (right, wrong, alone, left)] == [True, True, False, False]
    assert (rows[uuid.UUID(left.id)].status, rows[uuid.UUID(left.id)].reward) == ("abandoned", None)
    assert sorted(row.seq for row in rows.values()) == [0, 1, 2, 3]

    points = {(p.name, p.step): p.value for p in MetricPoint.objects.filter(run=run)}
    assert points["reward/mean", 3] == pytest.approx(2 / 3) and points["reward/arithmetic", 3] == pytest.approx(2 / 3)
    assert ("reward/mean", 4) not in points and points["trajectories/abandoned", 4] == 1
    assert points["cost/per_task", 4] == pytest.approx(0.001) and points["cost/total", 4] == pytest.approx(0.004)
    assert points["throughput/effective_trajectories_per_hour", 4] == \
        pytest.approx(points["throughput/trajectories_per_hour", 4] / 2)
    assert not {name for name, _ in points if name.split("/")[0] in ("policy", "loss", "idle", "staleness")}
    run.refresh_from_db()
    assert run.step == 4 and (run.summary["episodes"], run.summary["effective"]) == (4, 2)
    assert run.summary["statuses"] == {"ok": 3, "abandoned": 1}
    assert 2 <= run.summary["active_seconds"] < 10  # four episodes of 2 s played at once: 2 s of the run's time

    # Recorded again (the server retrying after a lost answer): overwritten in place, counted once.
    record_episode(run, wrong, trainer_step=3)
    run.refresh_from_db()
    assert Archived.objects.filter(run=run).count() == 4 and run.summary["episodes"] == 4
    assert run.summary["effective"] == 2


def test_an_episode_without_a_step_takes_its_number_in_the_run(run, tasks):
    for answer in ("6", "7"):
        record_episode(run, episode(tasks, "add-00003", answer), trainer_step=None)
    assert sorted(Archived.objects.filter(run=run).values_list("seq", "step")) == [(0, 1), (1, 2)]


def test_the_run_is_named_once_and_its_name_is_not_anothers(run, project, registry, owner):
    again = external_run(project=project, name="trl-qwen-grpo", bundle_version=registry["bundle"], user=owner,
                         client="trl", model="Qwen/Qwen3-0.6B")
    assert again.pk == run.pk and Run.objects.filter(project=project).count() == 1
    run_create(project=project, bundle=registry["bundle"], steps=2, name="ours", kind=RunKind.GRPO, actor=owner)
    with pytest.raises(ExternalRunRefused, match="'ours' is the name of a GRPO training run") as refused:
        external_run(project=project, name="ours", bundle_version=registry["bundle"], user=owner, client="trl",
                     model="m")
    assert (refused.value.status, refused.value.field) == (409, "run")
    with pytest.raises(ExternalRunRefused, match="is not a bundle of project"):
        external_run(project=project, name="x", bundle_version=registry["domain"], user=owner, client="trl",
                     model="m")
    with pytest.raises(ExternalRunRefused) as long_model:
        external_run(project=project, name="x", bundle_version=registry["bundle"], user=owner, client="trl",
                     model="m" * 301)
    assert long_model.value.errors[0].field == "model"


def test_nothing_of_the_studios_ever_runs_it(run, settings):
    assert run_claim(run_id=run.pk, stale_after=0) is None
    Run.objects.filter(pk=run.pk).update(heartbeat_at="2000-01-01T00:00:00Z")  # its trainer quiet for years
    assert runs_requeue_lost(stale_after=1) == []
    assert not any(lane(Run.objects.all()).filter(pk=run.pk).exists() for lane in LANES.values())
    assert train_next_queued("training") is False
    run.refresh_from_db()
    assert (run.status, run.attempt) == (RunStatus.RUNNING, 1)


def test_a_finished_run_refuses_the_episodes_that_come_after(run, tasks, owner, project, registry):
    record_episode(run, episode(tasks, "add-00003", "6"), trainer_step=1)
    with pytest.raises(RunError, match="cannot pause its trainer"):
        run_request(run=run, action="pause", actor=owner)
    run_request(run=run, action="finish", actor=owner)
    run.refresh_from_db()
    assert run.status == RunStatus.COMPLETED and run.finished_at is not None
    with pytest.raises(ExternalRunRefused, match="'trl-qwen-grpo' was completed at .* name a new run") as late:
        record_episode(run, episode(tasks, "add-00004", "8"), trainer_step=2)
    assert late.value.status == 409
    with pytest.raises(ExternalRunRefused, match="was completed"):
        external_run(project=project, name="trl-qwen-grpo", bundle_version=registry["bundle"], user=owner,
                     client="trl", model="Qwen/Qwen3-0.6B")
    assert Archived.objects.filter(run=run).count() == 1
    with pytest.raises(RunError, match="already completed"):
        run_request(run=run, action="finish", actor=owner)


def test_finish_is_for_runs_trained_elsewhere_only(project, registry, owner):
    ours = run_create(project=project, bundle=registry["bundle"], steps=2, kind=RunKind.GRPO, actor=owner)
    with pytest.raises(RunError, match="only a run trained elsewhere is finished by hand"):
        run_request(run=ours, action="finish", actor=owner)


# --- every page and API that reads a run reads one trained elsewhere ------------------------------------------

@pytest.fixture
def recorded(run, tasks):
    """The run after two trainer steps: at step 1 a group of two on add-00003 (one answer right after a tool call,
    one wrong) and add-00004 alone; at step 2 add-00005 right, and add-00006 abandoned by its client."""
    played = {"tool": episode(tasks, "add-00003", "6", tool=True), "wrong": episode(tasks, "add-00003", "7"),
              "alone": episode(tasks, "add-00004", "8"), "later": episode(tasks, "add-00005", "10"),
              "left": episode(tasks, "add-00006", "", status=TrajectoryStatus.ABANDONED)}
    for name, step in (("tool", 1), ("wrong", 1), ("alone", 1), ("later", 2), ("left", 2)):
        record_episode(run, played[name], trainer_step=step)
    run.refresh_from_db()
    return run, played


def test_every_page_reads_a_run_trained_elsewhere(login, owner, project, registry, recorded, tasks, api_as, settings,
                                                  django_capture_on_commit_callbacks):
    run, played = recorded
    browser = login(owner)
    page = browser.get(reverse("runs:run_detail", kwargs={"project": project.slug, "run_id": run.pk}))
    html = page.content.decode()
    # What the run is, what it recorded, and only the panels its points fill: no trainer of ours, no losses.
    assert "data-trained-elsewhere>elsewhere, by <b>trl</b>, model <span class=\"code\">Qwen/Qwen3-0.6B" in html
    assert "trainer step <span data-step>2</span> · 5 episodes recorded, 2 effective · 1 abandoned" in html
    assert {p["key"] for p in page.context["panels"]} >= {"reward", "throughput", "cost"}
    assert not {p["key"] for p in page.context["panels"]} & {"idle", "staleness", "policy", "loss", "slope"}
    assert 'value="finish"' in html and 'value="pause"' not in html and "<dt>Attempt</dt>" not in html
    history = browser.get(reverse("runs:run_history", kwargs={"project": project.slug, "run_id": run.pk})).json()
    assert history["series"]["reward/mean"]["step"] == [1, 2]  # by the trainer's step
    assert history["series"]["reward/mean"]["value"] == pytest.approx([2 / 3, 1.0])
    assert history["series"]["cost/per_task"]["value"][-1] == pytest.approx(0.001)
    assert history["series"]["throughput/effective_trajectories_per_hour"]["value"][-1] > 0

    runs = browser.get(reverse("runs:run_list", kwargs={"project": project.slug})).content.decode()
    assert "step 2 · 5 episodes" in runs and "trained elsewhere (trl)" in runs and "from_run=" not in runs
    assert "trained elsewhere by trl" in browser.get(reverse("runs:home")).content.decode()
    again = browser.get(reverse("runs:run_new", kwargs={"project": project.slug}), {"from_run": str(run.pk)})
    form = again.context["form"]  # a run of ours on its bundle, the form's own kind and steps
    assert (form.chosen_kind, form.initial["bundle"], form.initial["steps"]) == ("grpo", run.bundle_id, 100)
    assert "external" not in dict(form.fields["kind"].choices)  # trained elsewhere: no kind the studio launches
    api = api_as(owner, project=project)
    detail = api.get(f"/projects/{project.slug}/runs/{run.pk}").json()
    assert (detail["kind"], detail["config"]["client"], detail["summary"]["episodes"]) == ("external", "trl", 5)
    assert api.get(f"/projects/{project.slug}/runs/{run.pk}/metrics", names="reward/mean").json()[
        "series"]["reward/mean"]["step"] == [1, 2]
    assert api.post(f"/projects/{project.slug}/runs", {"bundle": "arith-bundle", "steps": 1,
                                                       "kind": "external"}).status_code == 422

    # The replay: the turns the trainer's model wrote, the tool's sandbox result, the verdict by layer.
    replay = browser.get(reverse("trajectories:trajectory_detail",
                                 kwargs={"project": project.slug, "trajectory_id": played["tool"].id}))
    html = replay.content.decode()
    assert replay.status_code == 200 and "data-trained-elsewhere>a trainer elsewhere: <b>trl</b>" in html
    assert "trainer step 1 · effective" in html and "Let me compute it." in html and "calls <b>run_python</b>" in html
    assert '<pre class="stdout">6\n</pre>' in html and "<h3>exact layer</h3>" in html
    listed = browser.get(reverse("trajectories:trajectory_list", kwargs={"project": project.slug}),
                         {"run": str(run.pk), "status": "abandoned"})
    assert listed.content.count(b"data-trajectory=") == 1

    # A review queue over the run, one that follows it, and its export.
    rubric = version_publish(project=project, kind="rubric", slug="correctness", spec=RUBRIC, author=owner).version
    queue = queue_create(project=project, slug="elsewhere", rubric=rubric, actor=owner, filters={"run": str(run.pk)},
                         sampling={"rule": "random", "n": 10}, reviewers=[owner], follow_share=1.0)
    assert queue.items.count() == 5
    item = item_next(queue=queue, reviewer=owner)
    assert browser.get(reverse("review:item", kwargs={"project": project.slug, "queue": queue.slug,
                                                      "item_id": item.pk})).status_code == 200
    label_submit(queue=queue, item_id=item.pk, reviewer=owner, answers={"verdict": "correct"})
    exported = dataset_rows(queue, kind="sft")
    assert [row["provenance"]["trajectory"] for row in exported] == [str(item.trajectory_id)]
    with django_capture_on_commit_callbacks(execute=True):
        record_episode(run, episode(tasks, "add-00007", "7"), trainer_step=3)  # a new episode joins the queue
    assert queue.items.count() == 6

    # A dataset built from its trajectories.
    built = dataset_build(project=project, slug="from-elsewhere", fmt="sft", actor=owner,
                          sources=[{"type": "trajectories", "run": run.name, "reward_min": 1}])
    rows = [json.loads(line) for line in dataset_materialise(project=project, text=built.version.ref).path
            .read_text().splitlines()]
    assert len(rows) == 4 and {row["provenance"]["run_name"] for row in rows} == {run.name}
    assert rows[-1]["messages"][-1]["role"] == "assistant" and any(
        message["role"] == "tool" for row in rows for message in row["messages"])

    # The leaderboard's overlap check: an endpoint serving the model trained elsewhere, evaluated as trained by it.
    settings.EMBEDDED = True  # queued only: no Celery task goes to a broker
    settings.EGRESS_ALLOW = "127.0.0.0/8"
    endpoint_create(project=project, slug="qwen-tuned", base_url="http://127.0.0.1:9/v1", model="qwen-tuned",
                    actor=owner)
    suite = version_publish(project=project, kind="bundle", slug="arith-suite", author=owner, spec={
        "members": ["domain/arithmetic@latest"], "evaluation": {"tasks_per_template": 8, "seed": 1}}).version
    target = target_resolve(project=project, endpoint="qwen-tuned", trained_by=run.name)
    evaluation = evaluation_launch(project=project, suite=suite, actor=owner, **target)
    assert evaluation.source_run == run and evaluation.label == f"endpoint/qwen-tuned · {run.name}"
    assert evaluation.overlap["training"] == registry["bundle"].ref and len(evaluation.overlap["exact"]) == 8
    board = results.leaderboard([evaluation])
    assert board.rows[0].clean and board.rows[0].overlapping  # scored apart, as for a checkpoint of ours
    assert run.name in browser.get(reverse("evals:suite_head", kwargs={"project": project.slug, "slug": "arith-suite"})
                                   ).content.decode()
    ours = run_create(project=project, bundle=registry["bundle"], steps=2, name="ours", actor=owner)
    with pytest.raises(EvalError, match="ours is not a run trained elsewhere") as refused:
        evaluation_launch(project=project, suite=suite, actor=owner,
                          **target_resolve(project=project, endpoint="qwen-tuned", trained_by="ours"))
    assert refused.value.field == "trained_by" and ours.pk

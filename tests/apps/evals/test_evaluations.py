"""Evaluations end to end: a base model answers a suite through the real sandboxes and verifiers, the scores
carry intervals, two evaluations of the same key pair up by task, and a suite that differs only in its
verifier's version is refused a comparison that names the verifier (page, API). The runs list shows an
evaluation's score as its leaderboard does."""

import pytest
from django.core.management import CommandError, call_command

from apps.evals import results
from apps.evals.models import Evaluation
from apps.evals.services import EvalError, evaluation_launch
from apps.registry.services import version_publish
from apps.runs.attempts import run_attempt
from apps.runs.embedded import LANES
from apps.runs.models import MetricPoint, Run, RunStatus
from apps.runs.services import run_claim, run_create
from apps.trajectories.models import Trajectory
from apps.trajectories.services import trajectories_record
from tests.apps.evals.conftest import SUITE
from workers.rl.types import Trajectory as Answer
from workers.rl.types import TrajectoryStatus, Turn, trajectory_id
from workers.verifiers import Verdict

EXACT_ONLY = {"layers": [{"name": "exact", "kind": "exact", "checks": [{"type": "numeric", "reference": "{answer}"}]}]}


def _evaluate(**launch) -> Evaluation:
    evaluation = evaluation_launch(**launch)
    attempt = run_claim(run_id=evaluation.run_id, stale_after=0)
    run_attempt(run_id=evaluation.run_id, attempt=attempt)
    evaluation.refresh_from_db()
    return evaluation


@pytest.mark.sandbox
def test_a_base_model_on_a_suite_scores_pairs_and_refuses_another_key(client, project, registry, owner, suite, tiny,
                                                                       api_as):
    first = _evaluate(project=project, suite=suite, actor=owner, model=tiny)
    assert first.run.status == RunStatus.COMPLETED and first.run.config["evaluation"]["key"] == first.key
    rows = Trajectory.objects.filter(run=first.run)
    assert rows.count() == 8 * 2  # 8 tasks, 2 samples each
    assert {r.task_key for r in rows} == {r.task_key for r in rows.filter(sample=1)}
    [row] = results.leaderboard([first]).rows
    overall = row.scores[results.ALL]
    assert overall.tasks == 8 and overall.samples + row.infra_errors == 16
    assert overall.method == "bootstrap over tasks" and overall.low <= overall.mean <= overall.high
    assert set(overall.pass_at_k) == {1, 2}

    second = _evaluate(project=project, suite=suite, actor=owner, model=tiny)
    paired = results.compare(first, second)
    assert paired.by_domain["arithmetic"].tasks == 8 and paired.by_domain[results.ALL].tasks == 8

    # The same suite once its verifier has a new version: another key, and the difference is named.
    version_publish(project=project, kind="verifier", slug="numeric", spec=EXACT_ONLY, author=owner)
    other = version_publish(project=project, kind="bundle", slug="arith-suite-2", spec=SUITE, author=owner).version
    third = evaluation_launch(project=project, suite=other, actor=owner, model=tiny)
    assert third.key != first.key
    with pytest.raises(results.NotComparable, match=r"verifier/numeric: @1 against @2"):
        results.compare(first, third)

    api = api_as(owner)
    detail = api.get(f"/projects/{project.slug}/evals/{first.pk}")
    assert detail.status_code == 200 and detail.json()["scores"]["all"]["tasks"] == 8
    refused = api.get(f"/projects/{project.slug}/evals/{first.pk}/compare/{third.pk}")
    assert refused.status_code == 409 and "verifier/numeric: @1 against @2" in refused.json()["detail"]
    assert api.get(f"/projects/{project.slug}/evals/{first.pk}/compare/{second.pk}").status_code == 200

    client.force_login(owner)
    page = client.get(f"/p/{project.slug}/evals/arith-suite/{suite.number}/").content.decode()
    assert page.count("data-row=") == 2 and "data-detectable" in page
    compare = client.get(f"/p/{project.slug}/evals/compare/{first.pk}/{third.pk}/")
    assert compare.status_code == 409 and "verifier/numeric: @1 against @2" in compare.content.decode()


def test_launching_needs_a_suite_and_one_thing_to_evaluate(project, registry, owner, suite, tiny, api_as,
                                                            monkeypatch, settings):
    with pytest.raises(EvalError, match="is not an eval suite"):
        evaluation_launch(project=project, suite=registry["bundle"], actor=owner, model=tiny)
    with pytest.raises(EvalError, match="name one thing to evaluate"):
        evaluation_launch(project=project, suite=suite, actor=owner)
    api = api_as(owner)
    both = api.post(f"/projects/{project.slug}/evals", {"suite": "arith-suite", "model": "model/demo-tiny",
                                                               "endpoint": "x"})
    assert both.status_code == 400 and "exactly one" in both.json()["detail"], both.json()
    missing = api.post(f"/projects/{project.slug}/evals", {"suite": "arith-suite", "checkpoint": "nope@3"})
    assert missing.status_code == 404 and "no run 'nope'" in missing.json()["detail"]
    queued = api.post(f"/projects/{project.slug}/evals", {"suite": "arith-suite", "model": "model/demo-tiny"})
    assert queued.status_code == 201 and queued.json()["batches"] == 1 and queued.json()["status"] == "queued"
    # The embedded studio runs evaluations in a lane of their own, beside training.
    training = run_create(project=project, bundle=registry["bundle"], steps=1, actor=owner)
    waiting = Run.objects.filter(status=RunStatus.QUEUED)
    assert [str(r.pk) for r in LANES["evaluation"](waiting)] == [queued.json()["run"]]
    assert list(LANES["training"](waiting)) == [training]
    bad = api.post(f"/projects/{project.slug}/evals/endpoints/", {"slug": "x", "base_url": "ftp://x",
                                                                          "model": "m"})
    assert bad.status_code == 422 and bad.json()["errors"][0]["field"] == "base_url"  # its schema says http(s)
    monkeypatch.setenv("STUDIO_ENDPOINT_KEY_LOCAL", "local-key")  # the operator declares a credential
    settings.EGRESS_ALLOW = "127.0.0.1"  # and allows the loopback
    added = api.post(f"/projects/{project.slug}/evals/endpoints/",
                     {"slug": "local", "base_url": "http://127.0.0.1:9/v1", "model": "m",
                      "credential": "operator:LOCAL"})
    assert added.status_code == 201 and added.json()["credential"] == "operator:LOCAL", added.json()


def test_the_runs_list_shows_an_evaluations_score_not_its_last_batch(client, project, owner, suite, tiny):
    evaluation = evaluation_launch(project=project, suite=suite, actor=owner, model=tiny)
    run = evaluation.run
    # add-00000 passed three samples of three, add-00001 failed its one: the score is the mean of the tasks' means
    # (0.5), not of the samples (0.75); the last batch, a task that failed, had a reward/mean of 0.
    answers = [("add-00000", 1.0), ("add-00000", 1.0), ("add-00000", 1.0), ("add-00001", 0.0)]
    trajectories_record(run=run, attempt=1, trajectories=[Answer(
        id=trajectory_id(str(run.pk), seq, 0), run_id=str(run.pk), seq=seq, sample=0, domain="arithmetic",
        template="task_template/add-two@1", task_key=key, task_hash="0" * 64, image="sandbox_image/py-basic@1",
        verifier="verifier/numeric@1", policy_version=0, step=1, prompt_ids=[1],
        turns=[Turn(role="user", content=f"{key}="), Turn(role="assistant", content="7", token_ids=[7])],
        status=TrajectoryStatus.OK, reward=reward,
        verdict=Verdict(reward=reward, status="pass" if reward == 1 else "fail", layers_run=["exact"]),
        started_at=1_700_000_000.0, finished_at=1_700_000_001.0) for seq, (key, reward) in enumerate(answers)])
    MetricPoint.objects.create(run=run, name="reward/mean", step=1, wall_time=1_700_000_001.0, value=1.0)
    MetricPoint.objects.create(run=run, name="reward/mean", step=2, wall_time=1_700_000_002.0, value=0.0)
    assert results.leaderboard([evaluation]).rows[0].scores[results.ALL].mean == 0.5
    client.force_login(owner)
    page = client.get(f"/p/{project.slug}/runs/").content.decode()
    row = page.split(f'<tr data-run="{run.pk}">', 1)[1].split("</tr>", 1)[0]
    assert "0.500 <span class=\"muted\">score</span>" in row and "0.000" not in row


def test_a_headless_evaluation_stopped_before_its_end_fails_and_says_how_it_resumes(project, suite, tiny, settings):
    """An attempt that makes no progress for RUN_STUCK_SECONDS is abandoned, to be resumed; `evaluate --headless`
    then exits with an error instead of printing the scores of the batches archived so far."""
    settings.RUN_STUCK_SECONDS = 0  # the first check after a batch finds it stuck
    with pytest.raises(CommandError, match="left to be resumed .*train --resume"):
        call_command("evaluate", suite="arith-suite", model="model/demo-tiny", headless=True, project=project.slug)
    evaluation = Evaluation.objects.get(project=project)
    assert evaluation.run.status == RunStatus.RUNNING
    settings.RUN_STUCK_SECONDS, settings.RUN_STALE_SECONDS = 900, 0  # as the error says: resumed here, to its end
    call_command("train", run_id=str(evaluation.run_id), headless=True, as_json=True)
    evaluation.run.refresh_from_db()
    assert evaluation.run.status == RunStatus.COMPLETED
    assert Trajectory.objects.filter(run=evaluation.run).count() == 8 * 2  # every batch once: none lost, none twice

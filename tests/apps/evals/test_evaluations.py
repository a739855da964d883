"""Evaluations end to end: a base model answers a suite through the real sandboxes and verifiers, the scores
carry intervals, two evaluations of the same key pair up by task, and a suite that differs only in its
verifier's version is refused a comparison that names the verifier (page, API)."""

import pytest

from apps.evals import results
from apps.evals.models import Evaluation
from apps.evals.services import EvalError, evaluation_launch
from apps.registry.services import version_publish
from apps.runs.attempts import run_attempt
from apps.runs.embedded import LANES
from apps.runs.models import Run, RunStatus
from apps.runs.services import run_claim, run_create
from apps.trajectories.models import Trajectory
from tests.apps.evals.conftest import SUITE

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

"""A training run that names an eval suite has its checkpoints evaluated as they are saved; the checkpoints stay
(kept out of the run's retention) until their evaluation reads them; aliases move with an audit row; the suite's
page draws the run's checkpoints as a timeline."""

import io
from pathlib import Path

import pytest
from django.core.management import call_command

from apps.accounts.models import AuditEvent
from apps.evals import results, selectors
from apps.evals.models import Evaluation
from apps.runs.attempts import run_attempt
from apps.runs.checkpoints import alias_move, checkpoint_resolve
from apps.runs.models import Checkpoint, RunStatus
from apps.runs.services import run_claim, run_create

TRAINING = {"model": "model/demo-tiny", "mode": "sync", "groups_per_step": 2, "group_size": 2,
            "eval_tasks_per_domain": 0, "checkpoint_every": 1, "keep_checkpoints": 1, "eval_suite": "arith-suite",
            "eval_suite_every": 1}


@pytest.mark.sandbox
@pytest.mark.django_db(transaction=True)  # commits as a worker's do: each checkpoint's evaluation is queued then
def test_checkpoints_are_evaluated_as_they_are_saved_and_kept(client, project, registry, owner, suite, tiny):
    run = run_create(project=project, bundle=registry["bundle"], steps=2, overrides=TRAINING, name="learner",
                     actor=owner)
    run_attempt(run_id=run.pk, attempt=run_claim(run_id=run.pk, stale_after=0))
    evaluations = list(Evaluation.objects.filter(source_run=run).order_by("checkpoint_step"))
    assert [e.checkpoint_step for e in evaluations] == [1, 2]
    assert [e.label for e in evaluations] == ["learner@1", "learner@2"]
    # Built as the run built its model: from its bundle's tasks, not the suite's.
    assert {e.run.config["evaluation"]["pretrained_on"] for e in evaluations} == {registry["bundle"].ref}
    # keep_checkpoints=1 removed step 1 from the run's directory; the evaluation's copy and row stay.
    first = Checkpoint.objects.get(run=run, step=1)
    assert first.kept and Path(first.path, "model.safetensors").is_file() and "/kept/" in first.path
    for evaluation in evaluations:
        run_attempt(run_id=evaluation.run_id, attempt=run_claim(run_id=evaluation.run_id, stale_after=0))
        evaluation.refresh_from_db()
        assert evaluation.run.status == RunStatus.COMPLETED
    # The suite samples the very domain the run trained on: every task it asks is in the training pool.
    assert evaluations[0].overlap["training"] == registry["bundle"].ref and len(evaluations[0].overlap["exact"]) == 8
    [row] = results.leaderboard(evaluations[:1]).rows
    assert row.clean[results.ALL].tasks == 0 and row.overlapping[results.ALL].tasks == 8
    lines = selectors.timeline(board=results.leaderboard(evaluations))
    assert [step for step, _ in lines["learner"]] == [1, 2]
    assert all(score.tasks == 8 for _, score in lines["learner"])

    alias_move(project=project, name="champion", checkpoint=checkpoint_resolve(project=project, name="learner@1"),
               actor=owner)
    assert checkpoint_resolve(project=project, name="champion").step == 1
    alias_move(project=project, name="champion", checkpoint=checkpoint_resolve(project=project, name="learner@latest"),
               actor=owner)
    moves = AuditEvent.objects.filter(action="checkpoint.alias.move").order_by("pk")
    assert [(m.details["from"], m.details["to"]) for m in moves] == [(None, "learner@1"), ("learner@1", "learner@2")]
    out = io.StringIO()
    call_command("checkpoints", "list", "learner", stdout=out)
    assert "learner@2" in out.getvalue() and "champion" in out.getvalue()

    client.force_login(owner)
    page = client.get(f"/p/{project.slug}/evals/arith-suite/{suite.number}/").content.decode()
    assert 'id="eval-timeline-figure"' in page and page.count("data-row=") == 2 and "data-overlap" in page
    registry_page = client.get(f"/p/{project.slug}/checkpoints/").content.decode()
    assert registry_page.count("data-checkpoint=") == 2 and "data-alias>champion" in registry_page
    moved = client.post(f"/p/{project.slug}/checkpoints/", {"name": "challenger", "checkpoint": "learner@1"})
    assert moved.status_code == 302 and checkpoint_resolve(project=project, name="challenger").step == 1
    paired = results.compare(*evaluations)
    assert paired.by_domain[results.ALL].tasks == 8


@pytest.mark.sandbox
@pytest.mark.django_db(transaction=True)  # a training attempt closes its connection at the end, as workers do
def test_an_endpoint_serving_a_checkpoint_scores_what_the_checkpoint_scores(project, registry, owner, tiny,
                                                                           egress_loopback):
    """`serve --checkpoint`'s model behind its app (with speculative decoding on), evaluated as an endpoint through
    the official client, against the checkpoint evaluated directly: greedy, the same answers and the same scores."""
    import threading
    import time

    import httpx
    import uvicorn

    from apps.evals.services import endpoint_create, evaluation_launch
    from apps.registry.services import version_publish
    from apps.runs.attempts.evaluation import checkpoint_model
    from apps.trajectories.models import Trajectory
    from workers.rl.serving.app import build_app

    run = run_create(project=project, bundle=registry["bundle"], steps=1, name="learner", actor=owner,
                     overrides={**TRAINING, "eval_suite": "", "eval_suite_every": 0})
    run_attempt(run_id=run.pk, attempt=run_claim(run_id=run.pk, stale_after=0))
    greedy = version_publish(project=project, kind="bundle", slug="greedy-suite", author=owner, spec={
        "members": ["domain/arithmetic@latest"], "evaluation": {"tasks_per_template": 10, "temperature": 0.0}}).version
    checkpoint = checkpoint_resolve(project=project, name="learner@1")

    def evaluate(**target):
        evaluation = evaluation_launch(project=project, suite=greedy, actor=owner, **target)
        run_attempt(run_id=evaluation.run_id, attempt=run_claim(run_id=evaluation.run_id, stale_after=0))
        evaluation.refresh_from_db()
        assert evaluation.run.status == RunStatus.COMPLETED
        return evaluation

    direct = evaluate(checkpoint=checkpoint)
    # Served with speculative decoding on (serve --speculative-tokens 4): greedy answers are unchanged by it.
    model = checkpoint_model(checkpoint, overrides={"speculative_tokens": 4})
    assert model.engine.speculation.tokens == 4
    server = uvicorn.Server(uvicorn.Config(build_app(engine=model.engine, chat=model.chat, model_name="learner@1"),
                                          host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        endpoint = endpoint_create(project=project, slug="served", base_url=f"http://127.0.0.1:{port}/v1",
                                   model="learner@1", actor=owner)
        remote = evaluate(endpoint=endpoint)
        evaluated = model.engine.speculation_stats.as_dict()
        # Whether the suite's short greedy answers repeat their context depends on the checkpoint's numbers (another
        # CPU trains another one), so a prompt makes drafting certain: "Q" followed by each token of the vocabulary,
        # ending in "Q". Whatever token comes next, the bigram ("Q", it) is in the context: its drafts are verified.
        marker = model.chat.tokenizer.encode("Q")[0]
        prompt = [token for other in range(model.chat.tokenizer.vocab_size) for token in (marker, other)] + [marker]
        copied = httpx.post(f"http://127.0.0.1:{port}/v1/completions", timeout=120, json={
            "model": "learner@1", "prompt": prompt, "max_tokens": 8, "temperature": 0, "stop_token_ids": []})
        drafts = model.engine.speculation_stats.as_dict()
    finally:
        server.should_exit = True
        thread.join(5)
        model.close()
    assert copied.status_code == 200, copied.text
    assert drafts["verify_steps"] > evaluated["verify_steps"], (evaluated, drafts)  # served with drafts verified

    def answers(evaluation):
        return {(t.task_key, t.sample): (t.turns[-1]["content"], t.reward)
                for t in Trajectory.objects.filter(run=evaluation.run)}

    assert answers(remote) == answers(direct) and len(answers(direct)) == 10
    left, right = results.evaluation_rewards(direct), results.evaluation_rewards(remote)
    assert left.by_domain == right.by_domain and right.infra_errors == 0
    assert results.compare(direct, remote).by_domain[results.ALL].difference == 0

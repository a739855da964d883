"""Review labels to a trained model, in a real browser: a reviewer accepts two answers from the keyboard; an editor
builds a preference dataset from the queue's pairs (each row with its provenance), starts a DPO run on that dataset
version from the run form, and — once a worker has trained it — queues evaluations of the base model and of the
run's checkpoint on an eval suite and opens their paired comparison. The eval suite's tasks never reach the
dataset; the run pins the version and the hash of its rows."""

import re

import pytest
from django.urls import reverse

from apps.evals.models import Evaluation
from apps.evals.selectors import suite_task_ids
from apps.registry.services import version_publish
from apps.review.services import queue_create
from apps.runs.attempts import run_attempt
from apps.runs.models import Run
from apps.runs.services import run_claim, run_create
from apps.trajectories.services import trajectories_record
from tests.support.review import group
from tests.support.specimens import RUBRIC
from workers.rl.models.hf_tiny import make_tiny_hf_model

pytestmark = [pytest.mark.browser, pytest.mark.sandbox]


def _train_here(run_id) -> Run:
    """What a worker does with a queued run: claim it and carry out its attempt."""
    run_attempt(run_id=run_id, attempt=run_claim(run_id=run_id, stale_after=0))
    return Run.objects.get(pk=run_id)


def test_review_to_dataset_to_dpo_run_to_eval_comparison(page_as, live_url, project, registry, owner, member,
                                                         settings, tmp_path):
    settings.MODEL_DIRS = [tmp_path / "models"]
    settings.REMOTE_ROLLOUTS = False
    base = make_tiny_hf_model(tmp_path / "models" / "tiny", hidden_size=32, layers=1, heads=2, max_positions=64)
    version_publish(project=project, kind="model", slug="tiny", author=owner,
                    spec={"source": {"type": "local", "path": str(base)}})
    version_publish(project=project, kind="bundle", slug="held-out", author=owner, spec={
        "members": ["domain/arithmetic@latest"], "evaluation": {"tasks_per_template": 3}})
    asked = suite_task_ids(project=project)
    seqs = [seq for seq in range(20) if f"add-two/add-{seq:05d}" not in asked][:2]
    archive = run_create(project=project, bundle=registry["bundle"], steps=1, actor=owner)
    answers = group(archive, seqs[0], [1.0, 0.0]) + group(archive, seqs[1], [1.0, 0.0])
    trajectories_record(run=archive, attempt=1, trajectories=answers)
    reviewer = member("reviewer")
    rubric = version_publish(project=project, kind="rubric", slug="correctness", spec=RUBRIC, author=owner).version
    queue_create(project=project, slug="accept", rubric=rubric, actor=owner, reviewers=[reviewer],
                 sampling={"rule": "list", "trajectories": [answers[0].id, answers[2].id]})
    urls = {name: reverse(name, kwargs={"project": project.slug}) for name in ("datasets:new", "runs:run_new")}

    # The reviewer accepts both answers: verdict "correct", the summary, submit.
    page = page_as(reviewer)
    page.goto(live_url + reverse("review:queue", kwargs={"project": project.slug, "queue": "accept"}))
    page.click("[data-start]")
    for _ in range(2):
        page.wait_for_selector("[data-label-form] [aria-current=step]")
        item = page.url.split("#")[0]
        page.keyboard.press("1")
        page.keyboard.press("Enter")
        page.keyboard.press("Enter")
        page.wait_for_url(lambda url, item=item: not url.startswith(item))

    # The editor builds the queue's preference pairs into a dataset version.
    page = page_as(owner)
    page.goto(live_url + urls["datasets:new"])
    page.fill("input[name=slug]", "review-pairs")
    page.select_option("select[name=format]", "preference")
    page.check("input[name=use_review_pairs]")
    page.select_option("select[name=pairs_queue]", "accept")
    page.click("#dataset-new button[type=submit]")
    page.wait_for_url(re.compile(r"/datasets/review-pairs/1/$"))
    rows = page.locator("[data-rows] tr[data-row]")
    assert rows.count() == 2  # each accepted answer over its sibling with the lower reward
    provenance = rows.first.locator("[data-provenance]").inner_text()
    assert "review_pairs" in provenance and "accept" in provenance and "reward" in provenance
    sha256 = page.locator("[data-sha256]").inner_text().strip()

    # A DPO run on that version, from the run form.
    page.goto(live_url + urls["runs:run_new"])
    page.select_option("select[name=kind]", "dpo")
    page.fill("input[name=steps]", "1")
    page.fill("input[name=name]", "dpo-from-review")
    # A DPO run's form offers only its kind's settings: no evaluation tasks, no inference engine (it samples none).
    assert page.locator("input[name=eval_tasks_per_domain]").is_hidden()
    for name, value in (("model", "model/tiny"), ("dataset", "dataset/review-pairs@1"), ("batch_size", "2")):
        page.fill(f"input[name={name}]", value)
    page.click("[data-review]")
    page.click("[data-queue]")
    page.wait_for_url(re.compile(r"/runs/[0-9a-f-]{36}/$"))
    run = Run.objects.get(name="dpo-from-review")
    assert (run.kind, run.config["dataset"], run.config["dataset_sha256"]) == ("dpo", "dataset/review-pairs@1",
                                                                                sha256)
    assert _train_here(run.pk).status == "completed"

    # The base model and the run's checkpoint on the eval suite, then their paired comparison.
    suite = live_url + reverse("evals:suite_head", kwargs={"project": project.slug, "slug": "held-out"})
    for label in ("model/tiny@1", "dpo-from-review@1"):
        page.goto(suite)
        page.select_option("select[name=what]", label=label)
        page.click("form.inline button[type=submit]")
        page.wait_for_url(suite.rstrip("/") + "/1/")
    for evaluation in Evaluation.objects.all():
        assert _train_here(evaluation.run_id).status == "completed"
    page.goto(suite)
    page.click("a[title='dpo-from-review@1 compared with model/tiny@1']")
    page.wait_for_selector("[data-paired]")
    assert "dpo-from-review@1" in page.locator("main").inner_text()
    assert page.locator("[data-domain]").count() >= 1

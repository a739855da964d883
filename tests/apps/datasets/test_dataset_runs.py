"""A dataset version is what a run trains on: `--dataset dataset/<slug>` pins the version's exact reference and the
hash of its rows, a worker writes the version's file where it runs, and a dataset of the wrong format, or one that
is not in the registry, is refused at the dataset field. (Training on it: tests/e2e/test_preference_training.py and
tests/apps/demo/test_cold_start.py.)"""

from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from apps.datasets.services import dataset_build
from apps.runs.dataset_pins import dataset_here
from apps.runs.models import Run
from apps.runs.services import RunError, run_create


def test_a_dpo_run_on_review_pairs(labelled, project, registry, owner, settings, tmp_path):
    queue, _ = labelled
    pairs = dataset_build(project=project, slug="pairs", fmt="preference", actor=owner,
                          sources=[{"type": "review_pairs", "queue": queue.slug}]).version
    settings_given = ["--set", "batch_size=2"]

    with pytest.raises(CommandError, match="holds preference rows; a sft run trains on sft rows"):
        call_command("train", "--bundle", "arith-bundle", "--kind", "sft", "--dataset", "dataset/pairs",
                     "--steps", "1", "--headless", *settings_given)
    with pytest.raises(RunError, match="No dataset named .nope.") as missing:
        run_create(project=project, bundle=registry["bundle"], steps=1, kind="dpo", actor=owner, via="web",
                   overrides={"dataset": "dataset/nope"})
    assert missing.value.errors[0].field == "dataset"

    out = StringIO()
    call_command("train", "--bundle", "arith-bundle", "--kind", "dpo", "--dataset", "dataset/pairs", "--steps", "1",
                 *settings_given, stdout=out, stderr=StringIO())
    run = Run.objects.get(kind="dpo")
    assert (run.config["dataset"], run.config["dataset_sha256"]) == ("dataset/pairs@1", pairs.spec["content_sha256"])
    assert run.status == "queued"

    # Another host, sharing the blob storage: the file is written again from the rows the version pins, where that
    # host keeps it.
    settings.STORAGE_URL, settings.DATA_DIR = str(settings.DATA_DIR), tmp_path / "other-host"
    here = dataset_here(project=project, config=run.run_config)
    assert here.dataset_file.startswith(str(tmp_path / "other-host")) and here.dataset_file != run.config[
        "dataset_file"]


def test_the_api_starts_a_dpo_run_on_a_dataset_version_never_on_a_path(labelled, project, registry, owner, api_as,
                                                                       tmp_path):
    queue, _ = labelled
    dataset_build(project=project, slug="pairs", fmt="preference", actor=owner,
                  sources=[{"type": "review_pairs", "queue": queue.slug}])
    api = api_as(queue.reviewers.get(username="editor-user"), project=project, scope="write")  # an editor
    started = api.post("/projects/acme-rl/runs", {"bundle": "arith-bundle", "steps": 1, "kind": "dpo",
                                                  "config": {"dataset": "dataset/pairs"}})
    assert started.status_code == 201, started.content
    assert started.json()["kind"] == "dpo" and started.json()["config"]["dataset"] == "dataset/pairs@1"
    (tmp_path / "rows.jsonl").write_text("{}\n")
    refused = api.post("/projects/acme-rl/runs", {"bundle": "arith-bundle", "steps": 1, "kind": "dpo",
                                                  "config": {"dataset": str(tmp_path / "rows.jsonl")}})
    assert refused.status_code == 400 and "command line only" in refused.content.decode()

"""Datasets from labels: SFT rows of accepted trajectories that `datasets.load_dataset("json", ...)` reads,
preference pairs from one group, reward-hack negatives; Parquet and a datasets directory hold the same rows; every
row says where it came from."""

import json

import datasets
import pyarrow.parquet as pq
import pytest
from django.core.management import call_command

from apps.review.exports import dataset_rows
from tests.support.review import labelled_queue


@pytest.fixture
def labelled(project, registry, rubric, owner, member):
    """Two groups of three; two reviewers label sample 0 of each group (agreeing on one, not on the other, which
    an adjudicator settles) and sample 1 of the first group."""
    return labelled_queue(project=project, bundle=registry["bundle"], rubric=rubric, owner=owner,
                          reviewers=(member("reviewer"), member("editor")))


def test_sft_preference_and_hack_rows_with_their_provenance(labelled, tmp_path):
    queue, rows = labelled
    out = tmp_path / "sft.jsonl"
    call_command("review_export", "data", "--kind", "sft", "--out", str(out))
    loaded = datasets.load_dataset("json", data_files=str(out), split="train")
    assert {p["trajectory"] for p in loaded["provenance"]} == {rows[0].id, rows[3].id}
    by_trajectory = {row["provenance"]["trajectory"]: row for row in map(json.loads, out.read_text().splitlines())}
    assert set(by_trajectory) == {rows[0].id, rows[3].id}  # agreed "correct", and adjudicated "correct"
    first = by_trajectory[rows[0].id]
    assert first["messages"] == [{"role": "user", "content": "What is 0 + 1?"},
                                 {"role": "assistant", "content": "answer 1"}]
    assert first["provenance"]["reviewers"] == ["editor-user", "reviewer-user"]
    assert first["provenance"]["verifier"] == "verifier/numeric@1" and first["provenance"]["policy_version"] == 3
    assert by_trajectory[rows[3].id]["provenance"]["gold"] == "correct"
    assert len(loaded) == 2 and loaded[0]["messages"][0]["role"] == "user"

    call_command("review_export", "data", "--kind", "preference", "--out", str(tmp_path / "pairs.jsonl"))
    pairs = [json.loads(line) for line in (tmp_path / "pairs.jsonl").read_text().splitlines()]
    # Group 0: chosen sample 0 over sample 1 (labelled a hack); sample 2 (reward 1, unlabelled) is no worse.
    # Group 1: chosen sample 0 over sample 2 (lower reward); sample 1 has the same reward.
    assert sorted((p["provenance"]["chosen"]["trajectory"], p["provenance"]["rejected"], p["provenance"]["rejected_by"])
                  for p in pairs) == sorted([(rows[0].id, rows[1].id, "label"), (rows[3].id, rows[5].id, "reward")])
    assert pairs[0]["prompt"][0]["role"] == "user" and pairs[0]["chosen"][0]["role"] == "assistant"

    call_command("review_export", "data", "--kind", "hacks", "--format", "parquet", "--out", str(tmp_path / "h.pq"))
    table = pq.read_table(tmp_path / "h.pq").to_pylist()
    assert [json.loads(row["provenance"])["trajectory"] for row in table] == [rows[1].id]
    assert table[0]["response"] == [{"role": "assistant", "content": "answer 0"}]

    call_command("review_export", "data", "--kind", "sft", "--format", "hf", "--out", str(tmp_path / "hf"))
    assert len(datasets.load_from_disk(str(tmp_path / "hf"))) == 2


def test_the_api_streams_the_same_rows(labelled, api_as, project, member):
    api = api_as(member("viewer"), project=project, scope="read")
    response = api.get("/projects/acme-rl/review/queues/data/export", kind="sft")
    assert response.status_code == 200 and response["Content-Type"] == "application/x-ndjson"
    assert len(response.content.decode().splitlines()) == 2
    assert api.get("/projects/acme-rl/review/queues/data/export", kind="nope").status_code == 422


def test_the_tasks_of_eval_suites_are_left_out(labelled, api_as, project, owner, member):
    from apps.registry.services import version_publish

    api = api_as(member("viewer"), project=project, scope="read")
    # A suite that asks all 20 tasks of the template: every labelled trajectory is of one of them, so none is left.
    version_publish(project=project, kind="bundle", slug="held-out", author=owner, spec={
        "members": ["domain/arithmetic@latest"], "evaluation": {"tasks_per_template": 20}})
    assert api.get("/projects/acme-rl/review/queues/data/export", kind="sft").content == b""
    assert api.get("/projects/acme-rl/review/queues/data/export", kind="hacks").content == b""


def test_a_dataset_reads_each_reviewers_latest_revision(labelled):
    from apps.review.models import Label
    from apps.review.services import label_amend

    queue, rows = labelled
    # Bob amends his "correct" on sample 0 of group 0 to "format": the reviewers now differ and nobody decided.
    slip = Label.objects.select_related("reviewer").get(item__trajectory_id=rows[0].id,
                                                        reviewer__username="editor-user")
    bob = slip.reviewer
    label_amend(queue=queue, item_id=slip.item_id, label_id=slip.pk, reviewer=bob,
                answers={"verdict": "format"})
    assert {row["provenance"]["trajectory"] for row in dataset_rows(queue, kind="sft")} == {rows[3].id}
    # Then back to "correct" (revision 3): accepted again, its provenance naming only the latest answers.
    latest = Label.objects.get(item__trajectory_id=rows[0].id, reviewer=bob, current=True)
    label_amend(queue=queue, item_id=latest.item_id, label_id=latest.pk, reviewer=bob,
                answers={"verdict": "correct"})
    by_trajectory = {row["provenance"]["trajectory"]: row for row in dataset_rows(queue, kind="sft")}
    assert set(by_trajectory) == {rows[0].id, rows[3].id}
    provenance = by_trajectory[rows[0].id]["provenance"]
    assert sorted((label["reviewer"], label["answers"]["verdict"], label["revision"])
                  for label in provenance["labels"]) == [("editor-user", "correct", 3), ("reviewer-user", "correct", 1)]

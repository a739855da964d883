"""Datasets as versioned definitions: a build materialises rows from the archive, review labels, a reference check
and uploads, deduplicated, without the eval suites' tasks, each with its provenance, and publishes a version that
pins their hash; `dataset/<slug>@N` comes back as the same bytes, and nothing else passes for it."""

import hashlib
import json

import datasets
import pytest

from apps.datasets.errors import DatasetError
from apps.datasets.services import dataset_build, dataset_upload
from apps.registry.dataset_store import DatasetUnavailable, dataset_materialise, rows_key
from apps.registry.errors import SpecError
from apps.registry.services import version_publish
from apps.runs.models import RunKind, RunStatus
from apps.runs.services import run_create
from apps.trajectories.services import trajectories_record
from tests.support.review import group


def _jsonl(*rows) -> bytes:
    return "".join(json.dumps(row) + "\n" for row in rows).encode()


def _lines(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_build_pins_its_rows_and_comes_back_as_the_same_file(project, owner, labelled):
    queue, rows = labelled
    upload = dataset_upload(project=project, name="../../etc/extra.jsonl", fmt="sft", actor=owner, content=_jsonl(
        {"messages": [{"role": "user", "content": "What is 0 + 1?"}, {"role": "assistant", "content": "answer 1"}]},
        {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Capital of France?"},
                      {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function",
                                                                             "function": {"name": "search"}}]},
                      {"role": "tool", "content": "Paris", "tool_call_id": "c1"},
                      {"role": "assistant", "content": "Paris"}], "provenance": {"origin": "wiki"}},
        {"messages": [{"role": "user", "content": "What is  8 + 1?"}, {"role": "assistant", "content": "9"}]}))
    assert upload.name == "extra.jsonl" and upload.rows == 3
    sources = [{"type": "trajectories", "reward_min": 1, "accepted_in": queue.slug}, upload.source()]
    built = dataset_build(project=project, slug="accepted", fmt="sft", sources=sources, actor=owner)
    version = built.version
    assert version.ref == "dataset/accepted@1" and version.spec["rows"] == 4
    assert version.spec["left_out"] == {"duplicates": 1, "eval_tasks": 0}  # the upload's first row is the archive's

    file = dataset_materialise(project=project, text="dataset/accepted@1")
    assert hashlib.sha256(file.path.read_bytes()).hexdigest() == version.spec["content_sha256"] == file.sha256
    lines = _lines(file.path)
    by_source = {}
    for row in lines:
        by_source.setdefault(row["provenance"]["source"], []).append(row)
    accepted = {row["provenance"]["trajectory"] for row in by_source["trajectories"]}
    assert accepted == {rows[0].id, rows[3].id}  # reward 1 and accepted; the hack (sample 1) has reward 0
    review = by_source["trajectories"][0]["provenance"]["review"]
    assert review["queue"] == "data" and len(review["labels"]) == 2
    uploaded = by_source["upload"][0]
    assert uploaded["provenance"] == {"source": "upload", "file": "extra.jsonl", "sha256": upload.sha256, "line": 2,
                                      "upstream": {"origin": "wiki"}}
    assert uploaded["messages"][2] == {"role": "assistant", "content": "",
                                       "tool_calls": [{"id": "c1", "type": "function",
                                                       "function": {"name": "search"}}]}
    assert len(datasets.load_dataset("json", data_files=str(file.path), split="train")) == 4  # what TRL reads

    # The same sources over the same archive are the same rows: the version stays.
    again = dataset_build(project=project, slug="accepted", fmt="sft", sources=sources, actor=owner)
    assert not again.created and again.version == version
    # An eval suite that asks these tasks (add-00000 .. add-00019, "What is 8 + 1?" among them): the next build
    # leaves them out, the archive's by task, the upload's by its prompt; the upload's first row is no longer a
    # duplicate. @1 still holds them all.
    version_publish(project=project, kind="bundle", slug="held-out", author=owner, spec={
        "members": ["domain/arithmetic@latest"], "evaluation": {"tasks_per_template": 20}})
    narrower = dataset_build(project=project, slug="accepted", fmt="sft", sources=sources, actor=owner).version
    assert narrower.number == 2 and narrower.spec["left_out"] == {"duplicates": 0, "eval_tasks": 3}
    kept = _lines(dataset_materialise(project=project, text="accepted@2").path)
    assert [(row["provenance"]["source"], row["provenance"]["line"]) for row in kept] == [("upload", 1), ("upload", 2)]
    assert dataset_materialise(project=project, text="dataset/accepted@1").rows == 4


def test_preference_pairs_from_review_labels(project, owner, labelled):
    queue, rows = labelled
    version = dataset_build(project=project, slug="pairs", fmt="preference", actor=owner,
                            sources=[{"type": "review_pairs", "queue": queue.slug}]).version
    pairs = _lines(dataset_materialise(project=project, text="dataset/pairs").path)
    assert version.spec["rows"] == len(pairs) == 2
    assert {(p["provenance"]["chosen"]["trajectory"], p["provenance"]["rejected"]) for p in pairs} == {
        (rows[0].id, rows[1].id), (rows[3].id, rows[5].id)}
    assert all(p["provenance"]["source"] == "review_pairs" and p["prompt"][0]["role"] == "user"
               and p["chosen"][0]["role"] == p["rejected"][0]["role"] == "assistant" for p in pairs)
    with pytest.raises(DatasetError, match="cannot take trajectories"):
        dataset_build(project=project, slug="pairs", fmt="preference", actor=owner,
                      sources=[{"type": "trajectories"}])
    with pytest.raises(DatasetError, match="no review queue 'nope'") as refused:
        dataset_build(project=project, slug="pairs", fmt="preference", actor=owner,
                      sources=[{"type": "review_pairs", "queue": "nope"}])
    assert refused.value.errors[0].field == "sources[0].queue"


def test_a_reference_checks_tool_calling_trajectories(project, registry, owner):
    check = run_create(project=project, bundle=registry["bundle"], steps=1, kind=RunKind.REFERENCE, actor=owner)
    answered = group(check, 7, [1.0, 0.0])
    answered[0].turns[1].tool_calls = []
    trajectories_record(run=check, attempt=1, trajectories=answered)
    with pytest.raises(DatasetError, match="no completed reference check"):
        dataset_build(project=project, slug="cold-start", fmt="sft", actor=owner,
                      sources=[{"type": "reference_check", "bundle": "arith-bundle"}])
    type(check).objects.filter(pk=check.pk).update(status=RunStatus.COMPLETED)
    version = dataset_build(project=project, slug="cold-start", fmt="sft", actor=owner,
                            sources=[{"type": "reference_check", "bundle": "arith-bundle"}]).version
    [row] = _lines(dataset_materialise(project=project, text="dataset/cold-start@1").path)
    assert version.spec["rows"] == 1 and row["provenance"]["trajectory"] == answered[0].id  # the one that passed
    assert row["provenance"]["bundle"] == "bundle/arith-bundle@1"
    with pytest.raises(DatasetError, match="no rows"):  # none of them called a tool
        dataset_build(project=project, slug="cold-start", fmt="sft", actor=owner,
                      sources=[{"type": "reference_check", "bundle": "arith-bundle", "tool_calls_only": True}])


@pytest.mark.parametrize("content, problem", [
    (b'{"messages": [{"role": "user", "content": "hi"}, {"role": "user", "content": "hi"}]}\n',
     "line 1: .*no assistant turn"),
    (b'{"messages": [{"role": "wizard", "content": "x"}, {"role": "assistant", "content": "y"}]}\n',
     "line 1: messages.0.role"),
    (b'\n\n{"messages": "nope"}\n[1]\n', "line 3: .*line 4: a row is a JSON object"),
    (b'{"messages": [], "extra": 1}\n', "line 1: .*"),
    (b"\xff\xfe", "not UTF-8"),
    (b"", "no rows"),
    (b"[" * 100_000 + b"]" * 100_000 + b"\n", "line 1"),
])
def test_an_upload_is_checked_line_by_line(project, owner, content, problem):
    with pytest.raises(DatasetError, match=problem) as refused:
        dataset_upload(project=project, name="x.jsonl", fmt="sft", content=content, actor=owner)
    assert refused.value.errors[0].field == "file"


def test_preference_uploads_need_their_prompt(project, owner):
    implicit = _jsonl({"chosen": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}],
                       "rejected": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "b"}]})
    with pytest.raises(DatasetError, match="implicit-prompt"):
        dataset_upload(project=project, name="p.jsonl", fmt="preference", content=implicit, actor=owner)


def test_only_stored_rows_can_be_pinned(project, owner, settings):
    spec = {"format": "sft", "sources": [{"type": "upload", "name": "x.jsonl", "sha256": "a" * 64}],
            "content_sha256": "b" * 64, "rows": 1}
    with pytest.raises(SpecError) as refused:
        version_publish(project=project, kind="dataset", slug="forged", spec=spec, author=owner)
    assert {e.field for e in refused.value.errors} == {"content_sha256", "sources[0].sha256"}

    upload = dataset_upload(project=project, name="x.jsonl", fmt="sft", actor=owner, content=_jsonl(
        {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}))
    version = dataset_build(project=project, slug="tiny", fmt="sft", sources=[upload.source()], actor=owner).version
    stored = settings.DATA_DIR / rows_key(version.spec["content_sha256"])
    stored.write_bytes(stored.read_bytes().replace(b'"a"', b'"b"'))  # changed behind the studio's back
    with pytest.raises(DatasetUnavailable, match="no longer hash"):
        dataset_materialise(project=project, text="dataset/tiny@1")
    with pytest.raises(LookupError, match="names a bundle, not a dataset"):
        dataset_materialise(project=project, text="bundle/arith-bundle@1")


def test_a_registry_export_carries_the_rows_each_version_pins(project, owner, settings, tmp_path):
    from apps.registry.files import export_project, import_directory

    upload = dataset_upload(project=project, name="x.jsonl", fmt="sft", actor=owner, content=_jsonl(
        {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}))
    version = dataset_build(project=project, slug="tiny", fmt="sft", sources=[upload.source()], actor=owner).version
    export_project(project=project, directory=tmp_path / "export")
    rows = tmp_path / "export" / "dataset" / "tiny.rows" / f"{version.spec['content_sha256']}.jsonl"
    assert rows.read_bytes() == dataset_materialise(project=project, text="dataset/tiny@1").path.read_bytes()
    # Another studio: an empty blob storage. The import stores what the files carry before it publishes.
    settings.DATA_DIR = tmp_path / "elsewhere"
    report = import_directory(directory=tmp_path / "export", project_slug="elsewhere", actor=owner)
    assert report.published == ["dataset/tiny@1"], report
    assert dataset_materialise(project=version.definition.project.__class__.objects.get(slug="elsewhere"),
                               text="dataset/tiny@1").sha256 == version.spec["content_sha256"]

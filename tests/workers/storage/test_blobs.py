"""The blob storage on both of its backends — a local directory and an S3 bucket on a real S3-compatible server
(moto's) — through one interface: blobs by key, and directories published whole (files first, manifest last)
that another host reads through a cache of its own."""

import json

import pytest

from workers.storage import MANIFEST, Storage, StorageChanged


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.s3)])
def root(request, tmp_path):
    """The URL of an empty storage root on each backend."""
    if request.param == "local":
        return str(tmp_path / "blobs")
    return request.getfixturevalue("object_store") + "/blobs"


def host(root: str, tmp_path, name: str) -> Storage:
    """The storage as one host sees it: the same root, a cache on this host's own disk."""
    return Storage(root, cache=tmp_path / name / "cache")


def test_blobs_are_written_whole_read_listed_and_removed_by_key(root, tmp_path):
    storage = host(root, tmp_path, "a")
    storage.write("artifacts/run/one/render.png", b"\x89PNG picture")
    storage.write("artifacts/run/two/log.txt", b"first")
    storage.write("artifacts/run/two/log.txt", b"second")  # replaced whole
    storage.write_many({f"artifacts/run/three/view-{n}.png": bytes([n]) * 100 for n in range(20)})  # all at once
    other = host(root, tmp_path, "b")
    assert other.read("artifacts/run/one/render.png") == b"\x89PNG picture"
    with other.open("artifacts/run/two/log.txt") as handle:
        assert handle.read() == b"second"
    assert other.names("artifacts/run") == ["one", "three", "two"] and other.names("nothing/here") == []
    assert len(other.names("artifacts/run/three")) == 20
    assert other.read("artifacts/run/three/view-7.png") == b"\x07" * 100
    assert other.exists("artifacts/run/one/render.png") and not other.exists("artifacts/run/one/other.png")
    with pytest.raises(FileNotFoundError):
        other.open("artifacts/run/one/other.png")
    assert other.child("artifacts/run").read("one/render.png") == b"\x89PNG picture"
    other.remove("artifacts/run/one")
    other.remove("artifacts/run/three")
    assert storage.names("artifacts/run") == ["two"]
    storage.remove("artifacts/run/never-written")  # nothing to remove is not an error


@pytest.mark.parametrize("key", ["../outside", "a/../../b", "/absolute", "a//b", "a/./b"])
def test_a_key_that_would_leave_the_root_is_refused(tmp_path, key):
    storage = Storage(tmp_path / "blobs")
    with pytest.raises(ValueError, match="not a storage key"):
        storage.write(key, b"x")


def test_a_published_directory_is_read_by_another_host_exactly_as_written(root, tmp_path):
    writer, reader = host(root, tmp_path, "a"), host(root, tmp_path, "b")
    staging = writer.stage("models/tiny")
    (staging / "model.safetensors").write_bytes(b"w" * 3000)
    (staging / "tokenizer").mkdir()
    (staging / "tokenizer" / "vocab.json").write_text('{"a": 1}')
    manifest = writer.publish("models/tiny", staging, model="tiny")
    assert manifest["model"] == "tiny" and set(manifest["files"]) == {"model.safetensors", "tokenizer/vocab.json"}
    assert manifest["files"]["model.safetensors"]["bytes"] == 3000

    assert reader.published("models/tiny") and reader.manifest("models/tiny") == manifest
    directory = reader.fetch("models/tiny")
    assert (directory / "model.safetensors").read_bytes() == b"w" * 3000
    assert json.loads((directory / "tokenizer" / "vocab.json").read_text()) == {"a": 1}
    assert reader.fetch("models/tiny") == directory  # downloaded once, then read from the cache
    if not reader.local:
        assert directory.is_relative_to(tmp_path / "b" / "cache")
        assert writer.fetch("models/tiny").is_relative_to(tmp_path / "a" / "cache")  # the writer kept its copy
    into = reader.fetch("models/tiny", into=tmp_path / "b" / "models" / "tiny")
    assert (into / "model.safetensors").read_bytes() == b"w" * 3000

    # Published again (a resumed attempt writing the same step): readers get the new version.
    staging = writer.stage("models/tiny")
    (staging / "model.safetensors").write_bytes(b"v" * 10)
    writer.publish("models/tiny", staging)
    assert (reader.fetch("models/tiny") / "model.safetensors").read_bytes() == b"v" * 10
    assert not (reader.fetch("models/tiny") / "tokenizer").exists()

    writer.unpublish("models/tiny")
    assert not reader.published("models/tiny") and reader.names("models") == []
    with pytest.raises(FileNotFoundError):
        host(root, tmp_path, "c").fetch("models/tiny")


@pytest.mark.s3
def test_on_an_object_store_files_without_their_manifest_do_not_exist(object_store, tmp_path):
    """A writer that died mid-upload left files but no manifest: no reader takes them for a directory."""
    writer, reader = host(object_store, tmp_path, "a"), host(object_store, tmp_path, "b")
    writer.write("checkpoints/run/step-000004/model.safetensors", b"half of the weights")
    assert writer.names("checkpoints/run") == ["step-000004"]
    assert not reader.published("checkpoints/run/step-000004")
    assert reader.manifest("checkpoints/run/step-000004") is None
    with pytest.raises(FileNotFoundError, match="not published"):
        reader.fetch("checkpoints/run/step-000004")


@pytest.mark.s3
def test_a_file_that_no_longer_matches_its_manifest_is_never_handed_out(object_store, tmp_path):
    """A directory replaced while a reader downloads it: what it got differs from the manifest it read, so it
    reads again (here the manifest stays stale, so it gives up saying so)."""
    writer, reader = host(object_store, tmp_path, "a"), host(object_store, tmp_path, "b")
    staging = writer.stage("models/tiny")
    (staging / "model.safetensors").write_bytes(b"the weights")
    writer.publish("models/tiny", staging)
    writer.write("models/tiny/model.safetensors", b"other weights")
    with pytest.raises(StorageChanged, match="not the file its manifest describes"):
        reader.fetch("models/tiny")
    assert not (tmp_path / "b" / "cache" / "models" / "tiny").exists()


def test_locally_a_directory_is_staged_beside_its_place_and_renamed_into_it(tmp_path):
    """The embedded default keeps the studio's local layout: KEY.partial, then a rename; the manifest inside."""
    storage = Storage(tmp_path / "blobs")
    staging = storage.stage("checkpoints/run/step-000002")
    assert staging == tmp_path / "blobs" / "checkpoints" / "run" / "step-000002.partial"
    (staging / "pipeline.json").write_text("{}")
    storage.publish("checkpoints/run/step-000002", staging)
    final = tmp_path / "blobs" / "checkpoints" / "run" / "step-000002"
    assert sorted(p.name for p in final.iterdir()) == [MANIFEST, "pipeline.json"] and not staging.exists()
    assert storage.fetch("checkpoints/run/step-000002") == final  # no copy: the directory itself

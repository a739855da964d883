"""Checkpoints in the blob storage: written whole (files, then the manifest), found and loaded by any host, the
run's newest `keep` retained; a run paused on one host resumes bit-identically on another from an S3 bucket."""

import copy
import json

import pytest
import torch

from tests.support.training import pause_after
from workers.rl.models.policies import TinyLMPolicy
from workers.rl.training.checkpoint import STEP_DIR, checkpoints, latest_checkpoint, load_checkpoint, save_checkpoint
from workers.storage import MANIFEST, Storage


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.s3)])
def run_root(request, tmp_path):
    """The URL of a run's checkpoint directory on each backend."""
    if request.param == "local":
        return str(tmp_path / "checkpoints" / "run")
    return request.getfixturevalue("object_store") + "/checkpoints/run"



def _save(storage, policy, step: int, keep: int = 3):
    return save_checkpoint(storage, step=step, policy=policy, trainer_state={"step": step, "lr": torch.tensor(0.5)},
                           pipeline_state={"step": step, "next_seq": step * 4}, keep=keep)


def test_a_checkpoint_saved_on_one_host_is_found_and_loaded_on_another(run_root, tmp_path, addition_base_model):
    policy = TinyLMPolicy(copy.deepcopy(addition_base_model))
    saved, removed = _save(Storage(run_root, cache=tmp_path / "a"), policy, 2)
    assert removed == [] and saved.step == 2 and saved.size > 0
    assert saved.path == Storage(run_root).url_of(STEP_DIR.format(2))

    other = Storage(run_root, cache=tmp_path / "b")
    [found] = checkpoints(other)
    assert (found.step, found.path, found.size) == (2, saved.path, saved.size)
    fresh = TinyLMPolicy(copy.deepcopy(addition_base_model))
    with torch.no_grad():
        for parameter in fresh.model.parameters():
            parameter.zero_()
    trainer_state, pipeline_state = load_checkpoint(found, policy=fresh)
    assert pipeline_state == {"step": 2, "next_seq": 8} and trainer_state["lr"].item() == 0.5
    for name, value in policy.model.state_dict().items():
        assert torch.equal(value, fresh.model.state_dict()[name]), name


def test_a_save_keeps_the_newest_checkpoints_and_removes_the_rest_everywhere(run_root, tmp_path, addition_base_model):
    policy = TinyLMPolicy(copy.deepcopy(addition_base_model))
    storage = Storage(run_root, cache=tmp_path / "a")
    removed = [_save(storage, policy, step, keep=2)[1] for step in (1, 2, 3, 4)]
    assert removed == [[], [], [1], [2]]
    assert [c.step for c in checkpoints(Storage(run_root, cache=tmp_path / "b"))] == [3, 4]
    assert storage.names() == ["step-000003", "step-000004"]  # nothing of steps 1 and 2 is left behind
    if not storage.local:
        assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["step-000003", "step-000004"]


def test_what_a_writer_killed_mid_save_left_is_no_checkpoint_and_the_next_save_removes_it(run_root, tmp_path,
                                                                                            addition_base_model):
    policy = TinyLMPolicy(copy.deepcopy(addition_base_model))
    storage = Storage(run_root, cache=tmp_path / "a")
    _save(storage, policy, 2)
    # Killed while writing step 4: locally a .partial directory; on an object store files without a manifest.
    key = STEP_DIR.format(4) + (".partial" if storage.local else "")
    storage.write(f"{key}/model.safetensors", b"half of the weights")
    assert latest_checkpoint(Storage(run_root, cache=tmp_path / "b")).step == 2
    _save(storage, policy, 6)
    assert storage.names() == ["step-000002", "step-000006"]


def test_a_local_checkpoint_keeps_the_studios_layout_and_one_written_before_manifests_still_loads(
        tmp_path, addition_base_model):
    policy = TinyLMPolicy(copy.deepcopy(addition_base_model))
    root = tmp_path / "checkpoints" / "run"
    saved, _ = _save(root, policy, 2)
    assert saved.path == str(root / "step-000002")
    files = {p.name for p in (root / "step-000002").iterdir()}
    assert files == {"model.safetensors", "trainer.pt", "pipeline.json", MANIFEST}
    manifest = json.loads((root / "step-000002" / MANIFEST).read_text())
    assert manifest["step"] == 2 and set(manifest["files"]) == files - {MANIFEST}
    (root / "step-000002" / MANIFEST).unlink()  # as the studio wrote checkpoints before there were manifests
    [legacy] = checkpoints(root)
    assert legacy.step == 2 and legacy.size == sum(p.stat().st_size for p in (root / "step-000002").iterdir())
    assert load_checkpoint(legacy, policy=policy)[1]["step"] == 2


@pytest.mark.s3
def test_a_run_paused_on_one_host_resumes_on_another_from_the_bucket_bit_identically(make_pipeline, object_store,
                                                                                       tmp_path):
    straight, straight_tracker = make_pipeline(4, mode="sync", checkpoint_dir=tmp_path / "straight")
    straight.run()

    bucket = object_store + "/checkpoints/run"
    first, tracker = make_pipeline(4, mode="sync", checkpoint_dir=Storage(bucket, cache=tmp_path / "host-a"),
                                   tracker=pause_after(2))
    assert first.run()["outcome"] == "paused"
    tracker.requested, tracker.on_step = "", None
    second, _ = make_pipeline(4, mode="sync", checkpoint_dir=Storage(bucket, cache=tmp_path / "host-b"),
                              tracker=tracker)
    resumed = second.run()
    assert resumed["outcome"] == "completed" and resumed["resumed_from_step"] == 2
    assert (tmp_path / "host-b" / "step-000002" / "model.safetensors").is_file()  # what host B downloaded

    expected, actual = straight.policy.model.state_dict(), second.policy.model.state_dict()
    for name in expected:
        assert torch.equal(expected[name], actual[name]), f"{name} differs after resuming on another host"
    assert sorted(straight_tracker.trajectories) == sorted(tracker.trajectories)

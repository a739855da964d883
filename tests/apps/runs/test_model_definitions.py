"""Base models as versioned definitions (kind `model`): publishing one pins the hash of its weights, a bundle's
run settings pin its version with the rest of the closure, a run created on it records the exact version and
the hash, and a worker whose copy of the weights hashes otherwise refuses to build the model."""

import pytest
from safetensors.torch import load_file, save_file

from apps.registry.errors import SpecError
from apps.registry.services import version_publish
from apps.runs.services import RunError, run_create
from workers.rl.config import GRPOConfig
from workers.rl.models.build import build_model
from workers.rl.models.hf_tiny import make_tiny_hf_model
from workers.rl.models.weights import WeightsMismatch, directory_weights_sha256


@pytest.fixture
def tiny(settings, tmp_path):
    root = tmp_path / "models"
    settings.MODEL_DIRS = [root]
    return make_tiny_hf_model(root / "tiny-llama", hidden_size=32, layers=1, heads=2, max_positions=64)


@pytest.fixture
def publish(project, owner):
    def publish(kind, slug, spec):
        return version_publish(project=project, kind=kind, slug=slug, spec=spec, author=owner).version

    return publish


def nudge_weights(directory):
    """Other weights in the same files (a fine-tune copied over the base, a corrupted download)."""
    path = directory / "model.safetensors"
    state = load_file(path)
    name = next(iter(state))
    state[name] = state[name] + 0.01
    save_file(state, path, metadata={"format": "pt"})


def test_a_run_on_a_model_definition_pins_its_version_and_the_hash_of_its_weights(project, owner, registry, tiny,
                                                                                   publish, tmp_path):
    model = publish("model", "tiny", {"source": {"type": "local", "path": str(tiny)}, "licence": "MIT",
                                      "context_length": 48})
    assert model.spec["weights_sha256"] == directory_weights_sha256(tiny)
    bundle = publish("bundle", "on-tiny", {"members": ["domain/arithmetic@latest"],
                                           "run_config": {"model": "model/tiny", "engine": "transformers"}})
    assert bundle.spec["run_config"]["model"] == "model/tiny@1"
    assert {"ref": "model/tiny@1", "content_hash": model.content_hash} in bundle.spec["resolved"]

    run = run_create(project=project, bundle=bundle, steps=2, actor=owner)
    assert run.config["model"] == str(tiny) and run.config["model_version"] == "model/tiny@1"
    assert run.config["model_sha256"] == model.spec["weights_sha256"] and run.config["context_length"] == 48
    built = build_model(GRPOConfig.from_dict({**run.config, "device": "cpu"}), None, models_dir=tmp_path,
                        pretrain_seconds=0)
    assert built.engine.max_context == 48  # the definition's bound, below the model's own 64
    built.engine.close()

    # New weights under the same path: the pinned run is refused by the worker; publishing the definition
    # again pins the new hash as a new version, which a new run (the bundle's lock aside) can name.
    nudge_weights(tiny)
    with pytest.raises(WeightsMismatch, match="the run pinned"):
        build_model(run.run_config, None, models_dir=tmp_path, pretrain_seconds=0)
    again = publish("model", "tiny", {"source": {"type": "local", "path": str(tiny)}, "licence": "MIT",
                                      "context_length": 48})
    assert again.number == 2 and again.spec["weights_sha256"] == directory_weights_sha256(tiny)
    newer = run_create(project=project, bundle=bundle, steps=2, overrides={"model": "model/tiny@2"}, actor=owner)
    assert newer.config["model_version"] == "model/tiny@2" and newer.config_hash != run.config_hash
    # A floating reference keeps the version the bundle locked.
    locked = run_create(project=project, bundle=bundle, steps=2, overrides={"model": "model/tiny"}, actor=owner)
    assert locked.config["model_version"] == "model/tiny@1"


def test_bad_model_definitions_and_pins_set_by_hand_are_refused_with_their_field(project, owner, registry, tiny,
                                                                                 publish, tmp_path):
    def problem(kind, spec) -> str:
        with pytest.raises(SpecError) as raised:
            publish(kind, "bad", spec)
        return str(raised.value)

    assert problem("model", {"source": {"type": "local", "path": str(tiny)}, "weights_sha256": "0" * 64}).startswith(
        f"weights_sha256: the weights of {tiny} hash to {directory_weights_sha256(tiny)}")
    outside = make_tiny_hf_model(tmp_path / "elsewhere", hidden_size=32, layers=1, heads=2, max_positions=64)
    assert "neither built in nor a directory inside the model directories" in problem(
        "model", {"source": {"type": "local", "path": str(outside)}})
    assert problem("model", {"source": {"type": "builtin", "name": "demo-tiny"}, "weights_sha256": "a" * 64}) == (
        "weights_sha256: the demo model's weights are made from a run's own tasks (the bundle pins them); leave "
        "this empty")
    assert problem("model", {"source": {"type": "hub", "repo": "x/y"}}).startswith("source")
    assert problem("bundle", {"members": ["domain/arithmetic@latest"],
                              "run_config": {"model": "model/none"}}).startswith("run_config.model: ")
    assert problem("bundle", {"members": ["domain/arithmetic@latest"],
                              "run_config": {"model_sha256": "a" * 64}}).startswith("run_config.model_sha256: set by")
    with pytest.raises(RunError, match="model_version: set by the studio"):
        run_create(project=project, bundle=registry["bundle"], steps=2, overrides={"model_version": "model/x@1"})
    with pytest.raises(RunError, match="config: model: No model named 'none'"):
        run_create(project=project, bundle=registry["bundle"], steps=2, overrides={"model": "model/none"})

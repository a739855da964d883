"""A run's config at its creation (run_create): the bounds of its kind's config (tests/workers/rl/test_config.py) reach
the person who asked, each problem naming its field; a model is built in or a Hugging Face directory (one with
a config.json) inside settings.MODEL_DIRS (STUDIO_MODEL_DIRS), never any other path of the worker's machine."""

import json
import math

import pytest

from apps.accounts.models import AuditEvent
from apps.runs.models import Run, RunStatus
from apps.runs.services import RunError, run_create


@pytest.fixture
def model_dirs(settings, tmp_path):
    """Two model directories of this test's own; returns the first."""
    roots = [tmp_path / "models", tmp_path / "more-models"]
    for root in roots:
        root.mkdir()
    settings.MODEL_DIRS = roots
    return roots[0]


def hugging_face_dir(path):
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    return path


@pytest.fixture
def create(project, registry, owner):
    def make(**overrides):
        return run_create(project=project, bundle=registry["bundle"], steps=5, overrides=overrides, actor=owner)

    return make


def refused(create, **overrides) -> str:
    with pytest.raises(RunError) as raised:
        create(**overrides)
    assert not Run.objects.exists() and not AuditEvent.objects.filter(action="run.create").exists()
    return str(raised.value)


@pytest.mark.parametrize(("overrides", "named"), [
    ({"group_size": 10**9}, "config: group_size: must be between 1 and 1024"),
    ({"group_size": 1e9}, "config: group_size: expected int"),
    ({"rollout_concurrency": 10**6}, "config: rollout_concurrency: must be between 1 and 4096"),
    ({"temperature": math.nan}, "config: temperature: must be between 0 and 10, not nan"),
    ({"device": "cuda;rm -rf"}, "config: device: 'cuda;rm -rf' is not auto, cpu, cuda or cuda:N"),
])
def test_a_config_out_of_bounds_is_refused_naming_its_field(create, overrides, named):
    assert named in refused(create, **overrides)


def test_a_model_outside_the_model_directories_is_refused(create, model_dirs, tmp_path):
    elsewhere = hugging_face_dir(tmp_path / "elsewhere" / "gpt")  # a real model, but not where models live
    for model in ("/etc", "/", str(elsewhere), f"{model_dirs}/../elsewhere/gpt", "models/gpt", "~/gpt"):
        message = refused(create, model=model, engine="transformers")
        assert f"config: model {model!r} is neither built in nor a directory inside the model directories" \
            in message, model
        assert str(model_dirs) in message  # says where models may be


def test_a_link_inside_the_model_directories_to_a_path_outside_is_refused(create, model_dirs, tmp_path):
    outside = hugging_face_dir(tmp_path / "outside")
    (model_dirs / "linked").symlink_to(outside, target_is_directory=True)
    assert "is neither built in nor a directory inside" in refused(create, model=str(model_dirs / "linked"),
                                                                    engine="transformers")


def test_a_directory_inside_without_config_json_is_refused(create, model_dirs):
    empty = model_dirs / "not-a-model"
    empty.mkdir()
    (empty / "weights.bin").write_bytes(b"\0" * 16)
    assert refused(create, model=str(empty), engine="transformers") == \
        f"config: model {str(empty)!r} has no config.json: not a Hugging Face model directory"
    assert "has no config.json" in refused(create, model=str(model_dirs / "absent"), engine="transformers")


def test_a_model_path_with_a_nul_character_is_refused_not_a_crash(create, model_dirs):
    # The API's JSON carries "\u0000"; the path check must refuse it, not fail on the file system's ValueError.
    with pytest.raises(RunError, match="config: model"):
        create(model=f"{model_dirs}/gpt\x00", engine="transformers")


def test_a_hugging_face_directory_inside_any_model_directory_is_accepted(create, model_dirs, settings):
    for root in settings.MODEL_DIRS:
        model = hugging_face_dir(root / "org" / "small-lm")
        run = create(model=str(model), engine="transformers")
        assert run.status == RunStatus.QUEUED and run.config["model"] == str(model)
    assert Run.objects.count() == 2


def test_a_built_in_model_needs_no_directory(create, model_dirs):
    assert create(model="builtin:demo-tiny").config["model"] == "builtin:demo-tiny"


def test_the_packaged_real_model_is_built_in_and_an_unknown_built_in_name_is_refused(create, model_dirs):
    assert "unknown built-in model 'builtin:gpt-5'" in refused(create, model="builtin:gpt-5")
    assert "runs on the torch engine" in refused(create, model="builtin:demo-tiny", engine="transformers")
    run = create(model="builtin:smollm2-135m-instruct", engine="transformers", lora_rank=8)
    assert run.config["model"] == "builtin:smollm2-135m-instruct"


def test_a_page_finds_a_models_tokenizer_directory_only_where_this_machine_has_it(model_dirs, settings, tmp_path):
    """The replay colours tokens with the run's tokenizer: a Hugging Face directory, or a packaged model once it
    is converted (a page never converts: that takes half a minute)."""
    from apps.common import wiring
    from workers.rl.models.packaged import SMOLLM2_135M, cache_directory

    settings.DATA_DIR = tmp_path / "data"
    model = hugging_face_dir(model_dirs / "org" / "lm")
    assert wiring.model_directory(str(model)) == model
    assert wiring.model_directory(str(model_dirs / "absent")) is None
    assert wiring.model_directory("builtin:demo-tiny") is None
    assert wiring.model_directory(SMOLLM2_135M.name) is None  # not converted here
    converted = cache_directory(SMOLLM2_135M, wiring.models_dir())
    converted.mkdir(parents=True)
    (converted / "source.json").write_text("{}")
    assert wiring.model_directory(SMOLLM2_135M.name) == converted

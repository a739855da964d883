"""Run configs (workers/rl/config.py): one class per kind of run, each holding that kind's settings. A knob a worker
cannot serve, a number that is not finite, a device that is not one a worker can name, and a setting of another kind
are refused, each problem naming its field, before a run is queued. A run stored before each kind had its own class
still loads. No Django: the configs are the engine's own."""

import dataclasses
import math

import pytest

from workers.rl.config import (
    BOUNDS,
    CONFIGS,
    SET_BY_THE_STUDIO,
    ConfigError,
    DPOConfig,
    EvaluationConfig,
    GRPOConfig,
    ReferenceCheckConfig,
    RunConfig,
    SFTConfig,
    check_recommended,
    config_class,
    field_help,
    run_config_schema,
)

# What a GRPO run stored before each kind had its own config class: every field of every kind, SFT's and
# DPO's among them (the old RunConfig's defaults).
STORED_BEFORE = {
    "batch_size": 16, "chat_template": "", "checkpoint_every": 10, "clip_high": 0.28, "clip_low": 0.2,
    "context_length": 0, "curriculum": True, "data_parallel": 1, "dataset": "", "dataset_file": "",
    "dataset_sha256": "", "device": "auto", "domain_quotas": {}, "domain_weights": {}, "dpo_beta": 0.1,
    "dynamic_sampling": True, "engine": "torch", "eval_suite": "", "eval_suite_every": 0, "eval_tasks_per_domain": 64,
    "evaluation": {}, "group_size": 8, "groups_per_step": 8, "inference_servers": "", "keep_checkpoints": 3,
    "kl_coef": 0.0, "learning_rate": 0.0003, "lora_alpha": 16, "lora_rank": 0, "lr_schedule": "constant",
    "max_grad_norm": 1.0, "max_staleness": 1, "max_tool_output_chars": 2000, "micro_batch_size": 64,
    "micro_batch_tokens": 0, "mode": "async", "model": "builtin:demo-tiny", "model_sha256": "", "model_version": "",
    "normalize_std": True, "oversampling": 4, "precision": "auto", "reference_per_template": 3,
    "rollout_concurrency": 16, "seed": 0, "start_from": {}, "temperature": 1.0, "verify_concurrency": 4,
    "warmup_steps": 0, "weight_decay": 0.0,
}


def refusal(config: type[RunConfig] = GRPOConfig, **overrides) -> str:
    with pytest.raises(ConfigError) as raised:
        config.resolve(overrides)
    return str(raised.value)


@pytest.mark.parametrize(("overrides", "named"), [
    ({"group_size": 10**9}, "group_size: must be between 1 and 1024, not 1000000000"),
    ({"group_size": 1e9}, "group_size: expected int, got 1000000000.0"),  # what JSON's 1e9 arrives as
    ({"rollout_concurrency": 10**6}, "rollout_concurrency: must be between 1 and 4096, not 1000000"),
    ({"temperature": math.nan}, "temperature: must be between 0 and 10, not nan"),
    ({"temperature": math.inf}, "temperature: must be between 0 and 10, not inf"),
    ({"learning_rate": -math.inf}, "learning_rate: must be between 0 and 1, not -inf"),
    ({"seed": 2**64}, "seed: must be between 0 and 9.22337e+18"),
    ({"device": "cuda;rm -rf"}, "device: 'cuda;rm -rf' is not auto, cpu, cuda or cuda:N"),
    ({"device": "cuda:0 && reboot"}, "device: 'cuda:0 && reboot' is not auto, cpu, cuda or cuda:N"),
    ({"group_size": True}, "group_size: expected int, got True"),
    ({"micro_batch_size": "64"}, "micro_batch_size: expected int, got '64'"),
])
def test_a_value_out_of_bounds_is_refused_naming_its_field(overrides, named):
    assert named in refusal(**overrides)


@pytest.mark.parametrize(("config", "overrides", "named"), [
    (SFTConfig, {"batch_size": 0}, "batch_size: must be between 1 and 65536, not 0"),
    (DPOConfig, {"dpo_beta": 0.0}, "dpo_beta: must be above 0"),
    (SFTConfig, {"learning_rate": 0.0}, "learning_rate: must be above 0"),
    (EvaluationConfig, {"verify_concurrency": 5000}, "verify_concurrency: must be between 1 and 1024, not 5000"),
    (ReferenceCheckConfig, {"reference_per_template": 0}, "reference_per_template: must be between 1 and 1000"),
])
def test_each_kind_checks_its_own_fields(config, overrides, named):
    assert named in refusal(config, **overrides)


def test_a_device_with_a_trailing_newline_is_refused():
    # `$` in a regular expression matches before a final newline: "cpu\n" must not pass as "cpu".
    for device in ("cpu\n", "cuda:1\n"):
        assert f"device: {device!r} is not auto, cpu, cuda or cuda:N" in refusal(device=device)
        assert f"device: {device!r} is not auto, cpu, cuda or cuda:N" in refusal(SFTConfig, device=device)


def test_every_problem_is_named_at_once():
    message = refusal(group_size=10**9, rollout_concurrency=10**6, temperature=math.nan, device="cuda;rm -rf")
    for field in ("group_size", "rollout_concurrency", "temperature", "device"):
        assert f"{field}:" in message


def test_a_setting_of_another_kind_is_refused_naming_it_and_the_kinds_that_read_it():
    with pytest.raises(ConfigError) as raised:
        SFTConfig.resolve({"group_size": 4, "clip_high": 0.3, "rollout_concurrency": 2, "batch_size": 8})
    assert [(e.field, e.problem) for e in raised.value.errors] == [
        ("group_size", "group_size is a GRPO setting; an SFT run does not use it"),
        ("clip_high", "clip_high is a GRPO setting; an SFT run does not use it"),
        ("rollout_concurrency", "rollout_concurrency is a GRPO and evaluation setting; an SFT run does not use it")]
    assert "dataset: dataset is an SFT and DPO setting; a GRPO run does not use it" in refusal(dataset="d/x@1")
    assert "dpo_beta is a DPO setting; an SFT run does not use it" in refusal(SFTConfig, dpo_beta=0.2)
    assert ("learning_rate is a GRPO, SFT and DPO setting; an evaluation does not use it"
            in refusal(EvaluationConfig, learning_rate=1e-3))
    assert ("model is a GRPO, SFT, DPO and evaluation setting; a reference check does not use it"
            in refusal(ReferenceCheckConfig, model="builtin:demo-tiny"))
    assert refusal(SFTConfig, no_such_knob=1).startswith("no_such_knob: unknown setting; an SFT run has batch_size, ")


def test_each_kind_has_only_the_settings_it_reads():
    names = {kind: cls.names() for kind, cls in CONFIGS.items()}
    assert set(names) == {"grpo", "sft", "dpo", "evaluation", "reference", "external"}
    assert names["sft"] < names["dpo"] and names["dpo"] - names["sft"] == {"dpo_beta"}
    grpo_only = {"group_size", "groups_per_step", "clip_low", "clip_high", "kl_coef", "temperature", "max_staleness"}
    assert grpo_only <= names["grpo"] and not grpo_only & (names["sft"] | names["evaluation"])
    assert {"dataset", "batch_size", "engine", "mode"} & names["grpo"] == {"engine", "mode"}
    assert names["reference"] == {"reference_per_template", "verify_concurrency", "max_tool_output_chars"}
    assert "evaluation" in names["evaluation"] and not {"learning_rate", "checkpoint_every"} & names["evaluation"]
    assert names["external"] == {"client", "trainer_model"}  # trained elsewhere: what its trainer said of itself
    assert config_class("sft") is SFTConfig
    with pytest.raises(ValueError, match="no run kind 'ppo'; the kinds are grpo, sft, dpo, evaluation, reference, "
                                         "external"):
        config_class("ppo")


@pytest.mark.parametrize("config", CONFIGS.values(), ids=list(CONFIGS))
def test_the_bounds_themselves_are_accepted_and_stored_resolved(config):
    defaults = config()
    edges = {name: (int(high) if isinstance(getattr(defaults, name), int) else float(high))
             for name, (_, high) in BOUNDS.items() if name in config.names()}
    if "clip_low" in edges:
        edges["clip_low"] = 0.99  # the bound is 1, but a clip of 1 would clip everything: the check refuses it
    resolved = config.resolve(edges)
    stored = resolved.to_dict()
    assert set(stored) == config.names()  # every field of its kind present, as a run stores it
    assert config.from_dict(stored) == resolved


def test_a_run_stored_before_each_kind_had_its_class_loads_without_the_other_kinds_settings():
    grpo = GRPOConfig.from_dict(STORED_BEFORE)
    assert grpo == GRPOConfig() and not hasattr(grpo, "dataset") and not hasattr(grpo, "dpo_beta")
    sft = SFTConfig.from_dict({**STORED_BEFORE, "dataset": "dataset/chats@2", "batch_size": 4})
    assert (sft.dataset, sft.batch_size) == ("dataset/chats@2", 4) and not hasattr(sft, "group_size")
    assert ReferenceCheckConfig.from_dict({**STORED_BEFORE, "model": "builtin:reference"}) == ReferenceCheckConfig()


@pytest.mark.parametrize("device", ["auto", "cpu", "cuda", "cuda:0", "cuda:15"])
def test_the_devices_a_worker_can_name_are_accepted(device):
    assert GRPOConfig.resolve({"device": device}).device == device


@pytest.mark.parametrize("config", CONFIGS.values(), ids=list(CONFIGS))
def test_the_defaults_are_within_bounds(config):
    resolved = config.resolve()
    for name, (low, high) in BOUNDS.items():
        if name in config.names():
            assert low <= getattr(resolved, name) <= high, name
    resolved.check()


def test_every_field_is_declared_once_and_documented():
    def below(cls):
        return {cls}.union(*(below(sub) for sub in cls.__subclasses__()))

    declared = [name for cls in below(RunConfig) for name in cls.__dict__.get("__annotations__", {})
                if name in {f.name for f in dataclasses.fields(cls)}]
    assert len(declared) == len(set(declared)), "declare a field in one class; the kinds that read it inherit it"
    every = set().union(*(cls.names() for cls in CONFIGS.values()))
    assert not [name for name in every if not field_help().get(name)], "document the field under it"
    assert not set(BOUNDS) - every


def test_a_bundles_run_config_holds_settings_of_every_kind_each_checked_by_the_kinds_that_take_it():
    check_recommended({"model": "model/tiny", "group_size": 4, "batch_size": 8, "dpo_beta": 0.2,
                       "reference_per_template": 2})
    with pytest.raises(ConfigError) as raised:
        check_recommended({"group_size": 1, "batch_size": 0, "no_such_knob": 1})
    assert {(e.field, e.problem) for e in raised.value.errors} == {
        ("no_such_knob", "unknown setting"), ("group_size", "GRPO compares samples, so a group needs at least 2"),
        ("batch_size", "must be between 1 and 65536, not 0")}
    schema = run_config_schema()["properties"]
    # a run trained elsewhere takes no settings from the bundle: its config is what its trainer said of itself
    assert set(schema) == set().union(*(cls.names() for cls in CONFIGS.values() if cls.launched_here)) - set(
        SET_BY_THE_STUDIO)
    assert not {"client", "trainer_model"} & set(schema)
    assert schema["group_size"]["minimum"] == 2 and schema["group_size"]["description"].endswith("Taken by: GRPO.")
    assert schema["batch_size"]["description"].endswith("Taken by: SFT, DPO.")
    assert schema["model"]["description"].endswith("Taken by: GRPO, SFT, DPO, evaluation.")

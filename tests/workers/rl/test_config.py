"""Run configs have bounds (workers/rl/config.py): a knob a worker cannot serve, a number that is not finite and
a device that is not one a worker can name are refused, each problem naming its field, before a run is queued.
No Django: RunConfig is the engine's own."""

import dataclasses
import math

import pytest

from workers.rl.config import BOUNDS, ConfigError, RunConfig


def refusal(**overrides) -> str:
    with pytest.raises(ConfigError) as raised:
        RunConfig.resolve(overrides)
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
    ({"no_such_knob": 1}, "no_such_knob: unknown setting"),
])
def test_a_value_out_of_bounds_is_refused_naming_its_field(overrides, named):
    assert named in refusal(**overrides)


def test_a_device_with_a_trailing_newline_is_refused():
    # `$` in a regular expression matches before a final newline: "cpu\n" must not pass as "cpu".
    for device in ("cpu\n", "cuda:1\n"):
        assert f"device: {device!r} is not auto, cpu, cuda or cuda:N" in refusal(device=device)


def test_every_problem_is_named_at_once():
    message = refusal(group_size=10**9, rollout_concurrency=10**6, temperature=math.nan, device="cuda;rm -rf")
    for field in ("group_size", "rollout_concurrency", "temperature", "device"):
        assert f"{field}:" in message


def test_the_bounds_themselves_are_accepted_and_stored_resolved():
    edges = {name: (int(high) if isinstance(getattr(RunConfig(), name), int) else float(high))
             for name, (_, high) in BOUNDS.items()}
    edges["clip_low"] = 0.99  # the bound is 1, but a clip of 1 would clip everything: check() refuses it
    config = RunConfig.resolve(edges)
    assert config.group_size == 1024 and config.rollout_concurrency == 4096
    stored = config.to_dict()
    assert set(stored) == {f.name for f in dataclasses.fields(RunConfig)}  # every field present, as a run stores it
    assert RunConfig.from_dict(stored) == config


@pytest.mark.parametrize("device", ["auto", "cpu", "cuda", "cuda:0", "cuda:15"])
def test_the_devices_a_worker_can_name_are_accepted(device):
    assert RunConfig.resolve({"device": device}).device == device


def test_the_defaults_are_within_bounds():
    config = RunConfig.resolve()
    for name, (low, high) in BOUNDS.items():
        assert low <= getattr(config, name) <= high, name
    config.check()

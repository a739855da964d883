"""An SFT run (LoRA) and a DPO run (every weight trained, so its reference must be the weights the run started
from, not the checkpoint's) killed with SIGKILL mid-run and resumed from their newest checkpoint train exactly as
the same run never interrupted: the same loss at every step after the checkpoint and the same final weights.
The killed process is a real one, killing itself at a fixed step (no sleeps, no timing); the resumed and the
uninterrupted runs train here. The run's own process and database around it are the GRPO runs' (apps/runs), tested
in tests/e2e/test_worker_killed.py."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from benchmarks.engine.supervised import addition_conversations, addition_preferences, write_jsonl
from workers.rl.config import config_class
from workers.rl.models.build import build_model
from workers.rl.models.hf_tiny import make_tiny_hf_model
from workers.rl.session import build_supervised_pipeline
from workers.rl.training.checkpoint import checkpoints
from workers.rl.training.data_files import file_sha256
from workers.rl.training.tracking import MemoryTracker

STEPS, KILLED_AT = 4, 3  # checkpoints at steps 2 and 4: killed after step 3, resumed from step 2
KILLED_RUN = """
import json, os, signal, sys
import torch
from workers.rl.config import config_class
from workers.rl.models.build import build_model
from workers.rl.session import build_supervised_pipeline
from workers.rl.training.tracking import MemoryTracker
kind, config, checkpoints, models, threads, killed_at, steps = sys.argv[1:]
torch.set_num_threads(int(threads))  # as the test's process: the same sums in the same order
config = config_class(kind).from_dict(json.loads(config))
def step(number, points):
    print(json.dumps([number, points[f"loss/{kind}"]]), flush=True)
    if number == int(killed_at):
        os.kill(os.getpid(), signal.SIGKILL)
model = build_model(config, None, models_dir=models, pretrain_seconds=0, sampling=False)
build_supervised_pipeline(run_id="killed", kind=kind, config=config, total_steps=int(steps), model=model,
                          tracker=MemoryTracker(on_step=step), checkpoint_dir=checkpoints).run()
"""


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    return make_tiny_hf_model(tmp_path_factory.mktemp("model") / "tiny", hidden_size=32, layers=2, heads=2)


@pytest.fixture
def one_thread():
    """Both processes sum in one thread: the same order of additions on any machine, and a model this small
    gains nothing from more (on a shared, loaded CPU, more threads only wait for one another)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _config(kind, model, data, **overrides):
    return config_class(kind).resolve({"model": str(model), "device": "cpu", "batch_size": 4,
                                       "micro_batch_size": 2, "learning_rate": 3e-3, "checkpoint_every": 2,
                                       "dataset": str(data), "dataset_file": str(data),
                                       "dataset_sha256": file_sha256(data), **overrides})


def _train(kind, config, checkpoint_dir, models, attempt=1):
    tracker = MemoryTracker(attempt=attempt)
    model = build_model(config, None, models_dir=models, pretrain_seconds=0, sampling=False)
    pipeline = build_supervised_pipeline(run_id="run", kind=kind, config=config, total_steps=STEPS, model=model,
                                         tracker=tracker, checkpoint_dir=checkpoint_dir)
    summary = pipeline.run()
    weights = {name: p.detach().clone() for name, p in model.policy.model.named_parameters() if p.requires_grad}
    return summary, {s["step"]: s["points"][f"loss/{kind}"] for s in tracker.steps}, weights


RUNS = {"sft": (addition_conversations, {"lora_rank": 4}), "dpo": (addition_preferences, {"dpo_beta": 0.5})}


def test_a_run_of_each_kind_killed_mid_run_resumes_exactly(tmp_path, tiny_model, one_thread):
    configs, killed = {}, {}
    for kind, (rows, overrides) in RUNS.items():  # both killed processes at once: their imports overlap
        data = write_jsonl(tmp_path / f"{kind}.jsonl", rows(6))  # 4 rows a step: the steps cross passes over it
        configs[kind] = _config(kind, tiny_model, data, **overrides)
        killed[kind] = subprocess.Popen(
            [sys.executable, "-c", KILLED_RUN, kind, json.dumps(configs[kind].to_dict()), str(tmp_path / kind),
             str(tmp_path / "models"), str(torch.get_num_threads()), str(KILLED_AT), str(STEPS)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=Path(__file__).parents[4])
    for kind, config in configs.items():
        stdout, stderr = killed[kind].communicate(timeout=240)
        assert killed[kind].returncode == -9, stderr[-3000:]  # SIGKILL, at the step it was told
        before_kill = dict(json.loads(line) for line in stdout.splitlines() if line.startswith("["))
        assert sorted(before_kill) == [1, 2, 3]
        assert [c.step for c in checkpoints(tmp_path / kind)] == [2]

        resumed, resumed_losses, resumed_weights = _train(kind, config, tmp_path / kind, tmp_path / "models",
                                                          attempt=2)
        whole, losses, weights = _train(kind, config, tmp_path / f"{kind}-whole", tmp_path / "models")
        assert (resumed["outcome"], resumed["resumed_from_step"], resumed["steps"]) == ("completed", 2, STEPS)
        assert {step: before_kill[step] for step in (1, 2)} == {step: losses[step] for step in (1, 2)}, kind
        assert resumed_losses == {step: losses[step] for step in range(3, STEPS + 1)}, kind
        assert resumed_weights.keys() == weights.keys()
        for name, value in weights.items():
            assert torch.equal(resumed_weights[name], value), f"{kind}: {name} differs after the resume"
        assert losses[STEPS] < losses[1], kind  # the run learned: the checks above compare two runs that train

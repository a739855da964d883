"""Data-parallel training (workers/rl/training/distributed.py) on 2 CPU processes under torchrun with gloo: an update on
two ranks, each on its shard of the same batch, equals the single-process update on the whole batch; a restart
resumes from rank 0's checkpoint and still agrees; the pipeline trains and resumes with a follower rank, both
ranks sampling its rollouts."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.support.distributed_worker import keep_gradients, make_batch, make_config, make_policy
from workers.rl.training import distributed
from workers.rl.training.checkpoint import checkpoints
from workers.rl.training.trainer import GRPOTrainer, training_rows

ROOT = Path(__file__).resolve().parents[4]
STEPS = 3  # the worker's batches: 5, 3 and 1 groups


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _torchrun(module: str, *args, timeout: float = 120) -> str:
    """`torchrun --nproc-per-node 2 -m module args` on this machine; returns its output, failing with it."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
               "--master-port", str(_free_port()), "--monitor-interval", "0.1", "-m", module, *map(str, args)]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-6000:]
    return output


@pytest.fixture(scope="module")
def single_process():
    """GRPOTrainer in this process on the worker's whole batches: after each step, the weights, the gradients it
    applied (before clipping) and its stats."""
    policy = make_policy()
    trainer = GRPOTrainer(policy, config=make_config(), total_steps=STEPS)
    gradients = keep_gradients(trainer)
    weights, applied, stats = {}, {}, {}
    while trainer.step < STEPS:
        step = trainer.step + 1
        stats[step] = trainer.train(make_batch(step - 1))
        weights[step] = {k: v.clone() for k, v in policy.model.state_dict().items()}
        applied[step] = dict(gradients)
    return weights, applied, stats


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    """Two launches of 2 ranks: step 1, then a restart that resumes from rank 0's checkpoint to step 3."""
    root = tmp_path_factory.mktemp("dp")
    first, second, checkpoint_dir = root / "first", root / "second", root / "checkpoints"
    first.mkdir()
    second.mkdir()
    _torchrun("tests.support.distributed_worker", "--steps", 1, "--checkpoint-dir", checkpoint_dir, "--out", first)
    after_first = [c.step for c in checkpoints(checkpoint_dir)]
    _torchrun("tests.support.distributed_worker", "--steps", STEPS, "--checkpoint-dir", checkpoint_dir,
              "--out", second)
    return first, second, after_first


def _assert_same_update(single_process, step: int, out: Path):
    """The gradients rank 0 applied at `step` (summed over the ranks) are the whole batch's, and so are the
    weights after it: allclose (atol 1e-6) wherever the gradient carries signal.

    Where the true gradient is 0 or nearly (the key bias, which attention ignores; a few weights this batch
    barely touches), the order of the sums leaves rounding noise (~1e-9) of the gradient's own size, and AdamW,
    dividing it by its own magnitude (g / (sqrt(v) + 1e-8)), turns that into a step of up to the learning rate
    either way. Any reordering does it: one process with another micro_batch_size differs there by as much.
    Those elements (any step's single-process |gradient| below 1e-5 so far; a few percent) are held to Adam's
    bound on a step instead."""
    weights, applied, stats = single_process
    gradients = load_file(str(out / f"gradients-{step}.safetensors"))
    assert gradients.keys() == applied[step].keys()
    for name, expected in applied[step].items():
        assert torch.allclose(gradients[name], expected, rtol=1e-5, atol=1e-7), \
            f"step {step} gradient of {name}: max difference {float((gradients[name] - expected).abs().max()):.3g}"
    actual = load_file(str(out / f"step-{step}.safetensors"))
    assert actual.keys() == weights[step].keys()
    learning_rates = sum(stats[s].learning_rate for s in range(1, step + 1))
    noise, total = 0, 0
    for name, expected in weights[step].items():
        silent = torch.zeros_like(expected, dtype=torch.bool)
        for s in range(1, step + 1):
            silent |= applied[s][name].abs() < 1e-5
        difference = (actual[name] - expected).abs()
        assert torch.all(difference[~silent] <= 1e-6), \
            f"step {step} {name}: max difference {float(difference[~silent].max()):.3g} where the gradient is not 0"
        assert torch.all(difference[silent] <= 2 * learning_rates), f"step {step} {name}"
        noise, total = noise + int(silent.sum()), total + silent.numel()
    assert noise < 0.1 * total, (noise, total)


def test_an_update_on_two_ranks_equals_the_single_process_update_on_the_whole_batch(single_process, two_ranks):
    weights, _, stats = single_process
    first, _, after_first = two_ranks
    initial = make_policy().model.state_dict()
    assert any(not torch.allclose(initial[k], weights[1][k]) for k in initial), "the update changed nothing"
    _assert_same_update(single_process, 1, first)
    reported = json.loads((first / "step-1.json").read_text())
    expected = stats[1]
    assert (reported["tokens"], reported["sequences"]) == (expected.tokens, expected.sequences)  # the whole batch's
    assert reported["grad_norm"] > make_config().max_grad_norm  # clipped: the norm is the all-reduced gradient's
    for name in ("loss", "kl", "entropy", "clip_fraction", "grad_norm"):
        assert reported[name] == pytest.approx(getattr(expected, name), rel=1e-5, abs=1e-7), name
    assert json.loads((first / "rank-1.json").read_text()) == {"updates": 1}
    assert after_first == [1]  # rank 0's checkpoint; the follower writes none


def test_two_ranks_restarted_from_rank_0s_checkpoint_continue_as_one_process_does(single_process, two_ranks):
    _, _, stats = single_process
    _, second, _ = two_ranks
    assert not (second / "step-1.safetensors").exists()  # resumed at step 1, not retrained
    for step in (2, 3):  # step 3's batch is one group: one rank trains, the other adds zeros
        _assert_same_update(single_process, step, second)
        reported = json.loads((second / f"step-{step}.json").read_text())
        assert reported["loss"] == pytest.approx(stats[step].loss, rel=1e-5, abs=1e-7)
        assert reported["learning_rate"] == stats[step].learning_rate  # the restored schedule
    assert stats[2].kl > 0  # the KL reference is the initial policy on both ranks, restored or not
    assert json.loads((second / "rank-1.json").read_text()) == {"updates": STEPS - 1}


def test_the_pipeline_trains_and_resumes_on_two_ranks(tmp_path):
    """The sync pipeline of tests.support.distributed_pipeline with rank 1 following: 2 steps, then a second attempt
    restored from the checkpoint at step 2 (a fresh policy from the base weights on every rank) to step 4. The
    base model is barely pretrained (right now and then: dynamic sampling draws until groups carry signal)."""
    output = _torchrun("tests.support.distributed_pipeline", "--steps", 2, "--resume-to", 4, "--checkpoint-dir",
                       tmp_path / "checkpoints", "--pretrain-steps", 20, "--summary", tmp_path / "summary.json")
    report = json.loads((tmp_path / "summary.json").read_text())
    first, second = (attempt["summary"] for attempt in report["attempts"])
    assert report["world_size"] == 2
    assert (first["outcome"], first["steps"]) == ("completed", 2)
    assert (second["outcome"], second["steps"], second["resumed_from_step"]) == ("completed", 4, 2)
    assert [a["checkpoints"] for a in report["attempts"]] == [[1, 2], [3, 4]]
    assert report["attempts"][0]["weights_sha256"] != report["attempts"][1]["weights_sha256"]
    assert "rank 1: took part in 4 updates" in output
    for attempt in report["attempts"]:  # both ranks sampled rollouts (engines/ranks.py)
        by_rank = attempt["summary"]["completions_by_rank"]
        assert by_rank["rank-0"] > 0 and by_rank["rank-1"] > 0


def test_an_async_run_generates_on_both_ranks_within_its_staleness_bound(tmp_path):
    """The async pipeline trains while rollouts sample on rank 0's engine and rank 1's server: every answer is
    within the staleness bound (none refused, none an infrastructure error)."""
    _torchrun("tests.support.distributed_pipeline", "--steps", 3, "--mode", "async", "--checkpoint-dir",
              tmp_path / "checkpoints", "--pretrain-steps", 20, "--summary", tmp_path / "summary.json")
    [attempt] = json.loads((tmp_path / "summary.json").read_text())["attempts"]
    summary = attempt["summary"]
    assert (summary["outcome"], summary["steps"]) == ("completed", 3)
    assert summary["trajectories"]["ok"] == summary["trajectories"]["total"]
    assert summary["staleness"]["max"] <= summary["staleness"]["bound"]
    by_rank = summary["completions_by_rank"]
    assert by_rank["rank-0"] > 0 and by_rank["rank-1"] > 0
    assert sum(by_rank.values()) >= summary["trajectories"]["total"]  # and rollouts in flight at the end


def test_groups_are_sharded_whole_deterministically_and_by_load():
    groups = [[((list(range(n)), [0] * n, [0.0] * n), 0.0)] * size for n, size in
              [(10, 4), (3, 4), (8, 2), (5, 6), (2, 1)]]
    shards = [distributed.shard_groups(groups, rank=rank, world_size=2) for rank in range(2)]
    assert sorted(map(id, shards[0] + shards[1])) == sorted(map(id, groups))  # every group once, whole
    assert shards == [distributed.shard_groups(groups, rank=rank, world_size=2) for rank in range(2)]
    # Tokens per group 40, 12, 16, 30, 2, heaviest first to the lighter rank: 40 → 0, 30 → 1, 16 → 1 (46),
    # 12 → 0 (52), 2 → 1 (48).
    assert [list(map(id, shard)) for shard in shards] == [[id(groups[0]), id(groups[1])],
                                                          [id(groups[2]), id(groups[3]), id(groups[4])]]
    assert distributed.shard_groups(groups[:1], rank=1, world_size=2) == []  # fewer groups than ranks


def test_one_process_trains_with_the_plain_trainer_and_torchruns_environment_is_read():
    assert distributed.topology_from_env({}) is None
    assert distributed.topology_from_env({"WORLD_SIZE": "1", "RANK": "0"}) is None
    topology = distributed.topology_from_env({"WORLD_SIZE": "4", "RANK": "3", "LOCAL_RANK": "1"})
    assert (topology.rank, topology.world_size, topology.local_rank, topology.leader) == (3, 4, 1, False)
    assert topology.backend == ("cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo")
    trainer = distributed.trainer_for(make_policy(), config=make_config(), total_steps=1)
    assert type(trainer) is GRPOTrainer
    assert training_rows(make_batch(0))[0][0][1] == make_batch(0)[0][0].advantage

"""One rank of tests/workers/rl/training/test_distributed.py, started by torchrun:

    torchrun --nproc-per-node 2 -m tests.support.distributed_worker --steps N --checkpoint-dir DIR --out DIR

Rank 0 leads as the pipeline does (distributed.LeaderTrainer): resumes from the newest checkpoint in DIR if
there is one, then trains on `make_batch(step)` until step N, writing after each step the weights to
OUT/step-S.safetensors, the gradients it applied to OUT/gradients-S.safetensors, and a checkpoint to DIR (rank 0
only). The other ranks follow, from weights of their own (another seed: rank 0's must reach them). The test
compares all this with GRPOTrainer's in one process.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

import torch
from safetensors.torch import save_file

from workers.rl.config import GRPOConfig
from workers.rl.models.policies import TinyLMPolicy
from workers.rl.models.tiny_lm import ModelConfig, TinyLM
from workers.rl.training import distributed
from workers.rl.training.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from workers.rl.training.trainer import assign_advantages
from workers.rl.types import Trajectory, Turn

VOCAB = 16
# Small micro-batches (accumulation differs between one process and a shard), a KL reference, a warmup (the
# restored schedule matters) and a clip the gradients reach.
CONFIG = {"micro_batch_size": 5, "kl_coef": 0.05, "warmup_steps": 2, "learning_rate": 1e-2, "max_grad_norm": 0.2,
          "weight_decay": 0.01, "clip_low": 0.4, "clip_high": 0.6, "device": "cpu"}
# Groups per step, of uneven sizes; the last step has one group: a rank with nothing to do still takes part.
GROUPS = {0: [4, 6, 3, 5, 4], 1: [6, 2, 5], 2: [5]}


def make_config() -> GRPOConfig:
    return GRPOConfig.resolve(CONFIG)


def make_policy() -> TinyLMPolicy:
    torch.manual_seed(0)
    return TinyLMPolicy(TinyLM(ModelConfig(vocab_size=VOCAB, block_size=32, n_layer=2, n_head=2, n_embd=32)))


def make_batch(step: int) -> list[list[Trajectory]]:
    """Step `step`'s groups, the same in every process: random prompts, completions and tool turns, sampling
    logprobs near a fresh model's (so some ratios are clipped and most are not), rewards 0 or 1."""
    rng = random.Random(step)
    groups = []
    for index, size in enumerate(GROUPS[step % len(GROUPS)]):
        prompt = [rng.randrange(VOCAB) for _ in range(rng.randint(3, 8))]
        group = []
        for sample in range(size):
            turns = []
            for turn in range(rng.randint(1, 2)):
                if turn:
                    turns.append(Turn(role="tool", content="", token_ids=[rng.randrange(VOCAB) for _ in range(2)]))
                length = rng.randint(2, 6)
                turns.append(Turn(role="assistant", content="", token_ids=[rng.randrange(VOCAB) for _ in range(length)],
                                  logprobs=[-2.77 + rng.gauss(0, 0.2) for _ in range(length)]))
            group.append(Trajectory(id=f"{step}-{index}-{sample}", run_id="dp", seq=index, sample=sample, domain="d",
                                    template="t", task_key=str(index), task_hash="", image="", verifier="",
                                    policy_version=step, prompt_ids=prompt, turns=turns,
                                    reward=float(rng.random() < 0.5)))
        if len({t.reward for t in group}) == 1:
            group[0].reward = 1.0 - group[0].reward  # every group carries signal
        assign_advantages(group, normalize_std=True)
        groups.append(group)
    return groups


def keep_gradients(trainer) -> dict:
    """The dict that holds, after each update, the gradients it applied: summed over the ranks, before clipping."""
    kept, sync = {}, trainer._sync_gradients

    def sync_and_keep():
        sync()
        kept.update({name: p.grad.detach().clone() for name, p in trainer.policy.model.named_parameters()
                     if p.grad is not None})

    trainer._sync_gradients = sync_and_keep
    return kept


def main(argv=None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--checkpoint-dir", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    topology = distributed.setup()
    try:
        if not topology.leader:
            torch.manual_seed(1000 + topology.rank)  # a replica built from other weights than rank 0's
            updates = distributed.follow()
            (args.out / f"rank-{topology.rank}.json").write_text(json.dumps({"updates": updates}))
            return
        with distributed.leading():
            policy = make_policy()
            trainer = distributed.trainer_for(policy, config=make_config(), total_steps=args.steps)
            checkpoint = latest_checkpoint(args.checkpoint_dir)
            if checkpoint is not None:
                state, _ = load_checkpoint(checkpoint, policy=policy)
                trainer.restore(state)
            gradients = keep_gradients(trainer)
            while trainer.step < args.steps:
                stats = trainer.train(make_batch(trainer.step))
                save_file({k: v.contiguous() for k, v in policy.model.state_dict().items()},
                          str(args.out / f"step-{trainer.step}.safetensors"))
                save_file(gradients, str(args.out / f"gradients-{trainer.step}.safetensors"))
                (args.out / f"step-{trainer.step}.json").write_text(json.dumps(stats.__dict__))
                save_checkpoint(args.checkpoint_dir, step=trainer.step, policy=policy,
                                trainer_state=trainer.state(), pipeline_state={}, keep=5)
    finally:
        distributed.teardown()


if __name__ == "__main__":
    main()

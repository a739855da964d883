"""The whole pipeline, data-parallel, without the studio: what tests/workers/rl/training/test_distributed.py starts
on two ranks (tests.support.distributed_worker is the trainer alone). a+b tasks, the numeric verifier, a TinyLM
taught the format and unreliable about the sums, the sync or async pipeline — trained by every rank torchrun starts.

    torchrun --nproc-per-node 2 -m tests.support.distributed_pipeline --steps 4 --checkpoint-dir /tmp/dp
    torchrun --nproc-per-node 2 -m tests.support.distributed_pipeline --steps 8 --checkpoint-dir /tmp/dp  # resumes
    python -m tests.support.distributed_pipeline --steps 4 --checkpoint-dir /tmp/one                     # one process

Rank 0 rolls out, grades, checkpoints and prints; the other ranks compute gradients on their shard of each
step (workers/rl/training/distributed.py). `--resume-to M` runs a second attempt in the same processes once the
first has ended: a fresh policy from the base weights, restored from the newest checkpoint (step --steps) and
trained to step M, as a restarted worker would. `--summary PATH`: rank 0 writes the attempts' summaries there as
JSON, with a digest of the final weights.

A program of the tests, not of the studio: a studio run trains data-parallel with `torchrun ... manage.py train`.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
from pathlib import Path

from workers.definitions.specs import Limits, parse_spec
from workers.rl.config import GRPOConfig
from workers.rl.engines.torch_engine import TorchEngine
from workers.rl.models.base_model import pretrain
from workers.rl.models.chat_formats import CharChat
from workers.rl.models.policies import TinyLMPolicy
from workers.rl.protocols import Model
from workers.rl.rollout.grading import LocalVerifier
from workers.rl.session import build_pipeline
from workers.rl.tasks.taskset import TaskSet
from workers.rl.training import distributed
from workers.rl.training.tracking import MemoryTracker
from workers.rl.types import TaskTemplate
from workers.sandbox import SandboxImage
from workers.verifiers import Item

RUN_ID = "00000000-0000-4000-8000-0000000d1570"
LIMIT = 10  # a, b below this


def addition_tasks() -> TaskSet:
    verifier = parse_spec("verifier", {"layers": [{"name": "number", "kind": "exact", "checks": [
        {"type": "numeric", "name": "answer", "reference": "{answer}", "abs_tolerance": 0, "rel_tolerance": 0}]}]})
    template = TaskTemplate(key="task_template/add@1", domain="arithmetic", system_prompt="",
                            prompt_template="{a}+{b}=", tools=(),
                            limits=Limits(max_turns=1, max_tokens=4, max_seconds=10),
                            image=SandboxImage(key="sandbox_image/none@1", layers=()), verifier_key="verifier/add@1",
                            verifier_spec=verifier)
    items = {f"add-{a}-{b}": Item(key=f"add-{a}-{b}", inputs={"a": a, "b": b}, hidden={"answer": a + b})
             for a in range(LIMIT) for b in range(LIMIT)}
    return TaskSet.single_template(template, items)


def base_model(directory: Path | None, *, pretrain_steps: int):
    """The base TinyLM: loaded from `directory` if it holds one, else pretrained on the a+b format (and saved
    there, when given)."""
    if directory is not None and (directory / "model.safetensors").is_file():
        return TinyLMPolicy.load(directory).model
    corpus = [(f"{a}+{b}=", [{"role": "assistant", "content": str(a + b)}])
              for a in range(LIMIT) for b in range(LIMIT)]
    model, _ = pretrain(corpus, steps=pretrain_steps, seed=0, block_size=64, wrong_fraction=0.0)
    if directory is not None:
        TinyLMPolicy(model).save_pretrained(directory)
    return model


def attempt(base, *, steps: int, checkpoint_dir: Path, config: GRPOConfig) -> dict:
    policy = TinyLMPolicy(copy.deepcopy(base), device=config.device if config.device != "auto" else "cpu")
    engine = TorchEngine(policy.model, device=policy.device, share=config.mode == "sync")
    tracker = MemoryTracker()
    pipeline = build_pipeline(run_id=RUN_ID, config=config, total_steps=steps, tasks=addition_tasks(),
                              model=Model(policy=policy, engine=engine, chat=CharChat()), tool_runner=None,
                              verifier=LocalVerifier(pool=None), tracker=tracker, checkpoint_dir=checkpoint_dir,
                              progress=lambda step, total, points: print(
                                  f"step {step}/{total}: reward {points.get('reward/mean', 0):.3f} "
                                  f"grad norm {points.get('policy/grad_norm', 0):.4f}", flush=True))
    try:
        summary = pipeline.run()
    finally:
        engine.close()
    state = policy.model.state_dict()
    digest = hashlib.sha256(b"".join(state[k].detach().cpu().numpy().tobytes() for k in sorted(state)))
    return {"summary": summary, "weights_sha256": digest.hexdigest(), "checkpoints": list(tracker.checkpoints)}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, required=True, help="train to this step")
    parser.add_argument("--checkpoint-dir", type=Path, required=True)
    parser.add_argument("--resume-to", type=int, help="then a second attempt, resumed from the checkpoint, to here")
    parser.add_argument("--base-model", type=Path, help="a TinyLM directory (made here if absent)")
    parser.add_argument("--pretrain-steps", type=int, default=300)
    parser.add_argument("--mode", choices=("sync", "async"), default="sync")
    parser.add_argument("--summary", type=Path, help="rank 0 writes the attempts' summaries here (JSON)")
    args = parser.parse_args(argv)
    topology = distributed.setup()  # None in a single process: then this is an ordinary run
    try:
        if topology is not None and not topology.leader:
            updates = distributed.follow()
            print(f"rank {topology.rank}: took part in {updates} updates", flush=True)
            return
        config = GRPOConfig.resolve({
            "mode": args.mode, "groups_per_step": 4, "group_size": 6, "micro_batch_size": 8, "learning_rate": 3e-3,
            "eval_tasks_per_domain": 0, "checkpoint_every": 1, "device": "cpu"})
        with distributed.leading():
            base = base_model(args.base_model, pretrain_steps=args.pretrain_steps)
            attempts = [attempt(base, steps=args.steps, checkpoint_dir=args.checkpoint_dir, config=config)]
            if args.resume_to:
                attempts.append(attempt(base, steps=args.resume_to, checkpoint_dir=args.checkpoint_dir, config=config))
        report = {"world_size": topology.world_size if topology else 1, "attempts": attempts}
        print(json.dumps({"world_size": report["world_size"],
                          "attempts": [a["summary"].get("steps") for a in attempts]}), flush=True)
        if args.summary:
            args.summary.write_text(json.dumps(report, default=str))
    finally:
        distributed.teardown()


if __name__ == "__main__":
    main()

"""`bench pipeline`: one workload with heavy-tailed environment times, trained async and sync; for each mode the
trainer's busy fraction, the wall time, the idle time by cause and the largest staleness.

The workload: a+b prompts sampled by a TinyLM big enough that a trainer step costs about as much as a step's
environment work spread over the sandboxes; each sample is graded by a `python_grader` that runs in a real
bubblewrap sandbox and first sleeps for the task's environment time, drawn from a Pareto distribution
(alpha 1.5, capped) — most environments answer fast, a few take seconds, as builds, renders and test suites do.
Both modes run the same tasks, seed, model and sandboxes; dynamic sampling and the curriculum are off so every
step trains on the same amount of data.
"""

from __future__ import annotations

import random
import tempfile
from pathlib import Path

from workers.definitions.specs import Limits, parse_spec
from workers.rl.config import GRPOConfig
from workers.rl.engines.torch_engine import TorchEngine
from workers.rl.models.chat_formats import CharChat
from workers.rl.models.policies import TinyLMPolicy
from workers.rl.models.tiny_lm import ModelConfig, TinyLM
from workers.rl.protocols import Model
from workers.rl.rollout.grading import LocalVerifier
from workers.rl.session import build_pipeline
from workers.rl.tasks.taskset import TaskSet
from workers.rl.training.tracking import MemoryTracker
from workers.rl.types import TaskTemplate
from workers.sandbox import SandboxImage, SandboxPool
from workers.sandbox.interface import SandboxBackend
from workers.verifiers import Item

GRADER = '''
def grade(sample, item):
    import time
    time.sleep(item["hidden"]["environment_seconds"])  # the environment: a build, a render, a test suite
    return 1.0 if sample["response"].strip() == str(item["hidden"]["answer"]) else 0.0
'''
RUN_ID = "00000000-0000-4000-8000-00000000be0c"


def environment_seconds(rng: random.Random, *, scale: float, alpha: float = 1.5, cap: float = 3.0) -> float:
    """Pareto(alpha) with minimum `scale`, capped: mean about scale * alpha / (alpha - 1)."""
    return min(cap, scale * (1 - rng.random()) ** (-1 / alpha))


def _world(*, tasks: int, scale: float, verify_concurrency: int):
    rng = random.Random(0)
    items = {}
    for index in range(tasks):
        a, b = rng.randrange(20), rng.randrange(20)
        items[f"t{index:04d}"] = Item(key=f"t{index:04d}", inputs={"a": a, "b": b}, hidden={
            "answer": a + b, "environment_seconds": round(environment_seconds(rng, scale=scale), 3)})
    image = SandboxImage(key="sandbox_image/bench-env@1", layers=({"type": "base", "image": "python-3.11"},),
                         warm_pool_size=verify_concurrency)
    verifier = parse_spec("verifier", {"layers": [{"name": "environment", "kind": "environment", "checks": [
        {"type": "python_grader", "name": "env", "source": GRADER, "timeout_seconds": 10}]}]})
    template = TaskTemplate(key="task_template/bench-add@1", domain="bench", system_prompt="",
                            prompt_template="{a}+{b}=", tools=(),
                            limits=Limits(max_turns=1, max_tokens=4, max_seconds=30),
                            image=image, verifier_key="verifier/bench-env@1", verifier_spec=verifier)
    return template, items


def _run_mode(mode: str, *, steps: int, template, items, pool, model_config: ModelConfig, overrides: dict) -> dict:
    import torch

    config = GRPOConfig.resolve({**overrides, "mode": mode})
    torch.manual_seed(0)
    policy = TinyLMPolicy(TinyLM(model_config))
    model = Model(policy=policy, engine=TorchEngine(policy.model), chat=CharChat())
    tracker = MemoryTracker()
    with tempfile.TemporaryDirectory() as checkpoints:
        pipeline = build_pipeline(run_id=RUN_ID, config=config, total_steps=steps,
                                  tasks=TaskSet.single_template(template, items), model=model, tool_runner=None,
                                  verifier=LocalVerifier(pool), tracker=tracker, checkpoint_dir=Path(checkpoints))
        summary = pipeline.run()
    model.close()
    environment = [t.timings.get("verification", 0.0) for t in tracker.trajectories.values()]
    return {"trainer_busy_fraction": summary["trainer_busy_fraction"], "wall_seconds": summary["wall_seconds"],
            "steps": summary["steps"], "trajectories": summary["trajectories"]["total"],
            "staleness_max": summary["staleness"]["max"], "staleness_bound": summary["staleness"]["bound"],
            "idle_seconds": summary["idle_seconds"],
            "seconds_per_step": round(summary["wall_seconds"] / max(summary["steps"], 1), 3),
            "environment_seconds": {"mean": round(sum(environment) / max(len(environment), 1), 3),
                                    "max": round(max(environment, default=0.0), 3)}}


def run(*, backend: SandboxBackend, steps: int = 30, environment_scale: float = 0.1, **_) -> dict:
    overrides = {"groups_per_step": 8, "group_size": 8, "max_staleness": 2, "rollout_concurrency": 16,
                 "verify_concurrency": 48, "dynamic_sampling": False, "curriculum": False, "micro_batch_size": 64,
                 "checkpoint_every": 10_000, "eval_tasks_per_domain": 0}
    template, items = _world(tasks=512, scale=environment_scale, verify_concurrency=overrides["verify_concurrency"])
    model_config = ModelConfig(vocab_size=CharChat().tokenizer.vocab_size, block_size=64, n_layer=4, n_embd=512,
                               n_head=8)
    pool = SandboxPool(backend)
    try:
        pool.warm(template.image)
        results = {mode: _run_mode(mode, steps=steps, template=template, items=items, pool=pool,
                                   model_config=model_config, overrides=overrides) for mode in ("async", "sync")}
    finally:
        pool.close()
    return {
        "workload": {"steps": steps, **{k: overrides[k] for k in ("groups_per_step", "group_size", "max_staleness",
                                                                  "verify_concurrency")},
                     "environment": f"Pareto(alpha=1.5, min={environment_scale}s, cap=3s) sleep in a sandboxed grader",
                     "model_parameters": sum(p.numel() for p in TinyLM(model_config).parameters())},
        **results,
        "async_speedup": round(results["sync"]["wall_seconds"] / max(results["async"]["wall_seconds"], 1e-9), 2),
    }

"""`bench pipeline`: two workloads (`pipeline_workloads`, `manage.py bench pipeline --pipeline-workloads ...`).

`standard`: heavy-tailed environment times, trained async and sync; for each mode the trainer's busy fraction, the
wall time, the idle time by cause, the largest staleness, the process's CPU time in its own code and in the
kernel with its page faults, and the whole machine's CPU time (the sandboxes' programs are other processes).
`compute_bound_speedup`: sync's wall time over its CPU work spread over every core, the most any overlap can win
on this machine — async does the same work, so its wall time cannot be shorter than that work over the cores.

The workload: a+b prompts sampled by a TinyLM big enough that a trainer step costs about as much as a step's
environment work spread over the sandboxes; each sample is graded by a `python_grader` that runs in a real
bubblewrap sandbox and first sleeps for the task's environment time, drawn from a Pareto distribution
(alpha 1.5, capped) — most environments answer fast, a few take seconds, as builds, renders and test suites do.
Both modes run the same tasks, seed, model and sandboxes; dynamic sampling and the curriculum are off so every
step trains on the same amount of data.

`long_horizon`: multi-turn tool tasks whose lengths vary tenfold (templates of 1, 2, 4 and 10 turns, the short
ones drawn most), trained async with partial rollouts on and off (GRPOConfig.partial_rollouts); for each the
trainer's busy fraction, effective trajectories per hour, the groups refused as too stale and the trained tokens
by staleness. A TinyLM pretrained for a few seconds to call `run_python` at every turn plays them: each call runs
in a real sandbox, and a trajectory ends at its template's turn limit, so its length is the template's. The
grader's reward is a coin flip in the sandbox: every group carries signal, and what is measured is how much of the
generation reaches the trainer. Without partial rollouts a 10-turn group that the short ones overtake by more than
max_staleness updates is refused whole; with them its recent turns are trained on.
"""

from __future__ import annotations

import random
import resource
import tempfile
from pathlib import Path

import psutil

from workers.definitions.specs import Limits, ToolSpec, parse_spec
from workers.rl.config import GRPOConfig
from workers.rl.engines.torch_engine import TorchEngine
from workers.rl.models.chat_formats import CharChat
from workers.rl.models.policies import TinyLMPolicy
from workers.rl.models.tiny_lm import ModelConfig, TinyLM
from workers.rl.protocols import Model
from workers.rl.rollout.grading import LocalVerifier
from workers.rl.rollout.tools import RUN_PYTHON_TOOL, SandboxToolRunner
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


# A few steps run untimed before the measured modes: the first run grows the sandbox pool to its demand (the pool
# keeps what it grew by while the image is in use), fills the allocator and loads torch's kernels, and without this
# the mode measured first paid for all of it (the long-horizon workload, on first: 16.2 s after another run in one
# probe, 19.8 s first in the bench, its counterpart alike both times).
WARM_UP_STEPS = 4
# Trainer steps a side when `bench pipeline` is given none: 12 on the long-horizon workload measured 1.03-1.39x from
# run to run.
STEPS = {"standard": 30, "long_horizon": 40}


def machine_cpu_seconds() -> float:
    """CPU time every process on the machine has used so far, idle and waiting for I/O left out (guest time is in
    user time already): the sandboxes' programs and the kernel's work for them count, which this process's own
    rusage misses."""
    times = psutil.cpu_times()
    return times.user + times.nice + times.system + times.irq + times.softirq + times.steal


def measured_run(pipeline) -> tuple[dict, dict]:
    """The pipeline's summary, and the CPU it took: this process's own (user and kernel seconds, page faults)
    and the whole machine's, with the machine's busy fraction — near 1, the cores set the pace, not the
    pipeline."""
    before, machine_before = resource.getrusage(resource.RUSAGE_SELF), machine_cpu_seconds()
    summary = pipeline.run()
    after, machine = resource.getrusage(resource.RUSAGE_SELF), machine_cpu_seconds() - machine_before
    cores = psutil.cpu_count()
    return summary, {
        "process": {"user_seconds": round(after.ru_utime - before.ru_utime, 2),
                    "system_seconds": round(after.ru_stime - before.ru_stime, 2),
                    "minor_faults": after.ru_minflt - before.ru_minflt},
        "machine": {"cpu_seconds": round(machine, 2), "cores": cores,
                    "busy_fraction": round(machine / max(summary["wall_seconds"] * cores, 1e-9), 3)}}


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
        summary, cpu = measured_run(pipeline)
    model.close()
    environment = [t.timings.get("verification", 0.0) for t in tracker.trajectories.values()]
    return {"trainer_busy_fraction": summary["trainer_busy_fraction"], "wall_seconds": summary["wall_seconds"],
            "steps": summary["steps"], "trajectories": summary["trajectories"]["total"],
            "staleness_max": summary["staleness"]["max"], "staleness_bound": summary["staleness"]["bound"],
            "idle_seconds": summary["idle_seconds"],
            "seconds_per_step": round(summary["wall_seconds"] / max(summary["steps"], 1), 3),
            "environment_seconds": {"mean": round(sum(environment) / max(len(environment), 1), 3),
                                    "max": round(max(environment, default=0.0), 3)},
            **cpu}  # where the kernel time went is in the README


TOOL_CALL_TEXT = '<tool_call>{"name": "run_python", "arguments": {"code": "1"}}</tool_call>'
COIN_GRADER = '''
def grade(sample, item):
    import random
    return float(random.random() < 0.5)
'''
LONG_HORIZON_TURNS = {1: 4.0, 2: 3.0, 4: 2.0, 10: 1.0}  # turn limit -> the template's weight: short ones most
PROMPT = "go {n:03d}"


def _long_horizon_world(*, tasks: int, verify_concurrency: int):
    """A TaskSet of one domain whose templates differ only in their turn limit; their image and coin grader."""
    from workers.rl.tasks.scheduler import DomainMix, TemplateMix
    from workers.rl.tasks.taskset import TaskSet

    image = SandboxImage(key="sandbox_image/bench-tools@1", layers=({"type": "base", "image": "python-3.11"},),
                         warm_pool_size=verify_concurrency)
    verifier = parse_spec("verifier", {"layers": [{"name": "coin", "kind": "environment", "checks": [
        {"type": "python_grader", "name": "coin", "source": COIN_GRADER, "timeout_seconds": 10}]}]})
    tool = ToolSpec.model_validate(RUN_PYTHON_TOOL)
    items = {f"t{index:04d}": Item(key=f"t{index:04d}", inputs={"n": index}, hidden={}) for index in range(tasks)}
    templates, mixes = {}, []
    for turns, weight in LONG_HORIZON_TURNS.items():
        key = f"task_template/bench-tools-{turns}@1"
        templates[key] = TaskTemplate(key=key, domain="bench-tools", system_prompt="", prompt_template=PROMPT,
                                      tools=(tool,), image=image, verifier_key="verifier/bench-coin@1",
                                      verifier_spec=verifier, limits=Limits(
                                          max_turns=turns, max_tokens=4096, max_seconds=300, max_turn_tokens=96,
                                          max_tool_errors=10))
        mixes.append(TemplateMix(key, weight, tuple(items)))
    taskset = TaskSet(templates=templates, domains=[DomainMix("bench-tools", 1.0, tuple(mixes))],
                      items={key: dict(items) for key in templates},
                      item_hashes={key: {k: k for k in items} for key in templates})
    return taskset, image


def _tool_caller(*, block_size: int, steps: int):
    """A TinyLM that answers every turn with the run_python call, pretrained on conversations of ten of them with
    the tool's real result between two (about a minute on two cores). Its positions are learned embeddings, so
    the prompts all have one width ("go 007"): a conversation's turns then sit where they were learned."""
    from workers.rl.models.base_model import pretrain

    result = "exit code 0\nstdout:\n"
    conversation = []
    for _ in range(10):
        conversation += [{"role": "assistant", "content": TOOL_CALL_TEXT}, {"role": "tool", "content": result}]
    corpus = [(PROMPT.format(n=n), conversation[:-1]) for n in range(8)]
    model, _ = pretrain(corpus, steps=steps, seed=0, block_size=block_size, wrong_fraction=0.0, short_fraction=0.0,
                        long_batch=8, lr=1e-2)
    return model


def _run_long_horizon(partial: bool, *, steps: int, taskset, pool, base_model, overrides: dict) -> dict:
    import copy

    config = GRPOConfig.resolve({**overrides, "mode": "async", "partial_rollouts": partial})
    policy = TinyLMPolicy(copy.deepcopy(base_model))
    model = Model(policy=policy, engine=TorchEngine(policy.model), chat=CharChat())
    tracker = MemoryTracker()
    with tempfile.TemporaryDirectory() as checkpoints:
        pipeline = build_pipeline(run_id=RUN_ID, config=config, total_steps=steps, tasks=taskset, model=model,
                                  tool_runner=SandboxToolRunner(pool), verifier=LocalVerifier(pool), tracker=tracker,
                                  checkpoint_dir=Path(checkpoints))
        summary, cpu = measured_run(pipeline)
    model.close()
    consumed = list(tracker.trajectories.values())
    turns = [sum(turn.role == "assistant" for turn in t.turns) for t in consumed]
    generated = sum(t.completion_tokens for t in consumed)
    return {"partial_rollouts": partial, "trainer_busy_fraction": summary["trainer_busy_fraction"],
            "effective_trajectories_per_hour": summary["throughput"]["effective_trajectories_per_hour"],
            "trajectories_per_hour": summary["throughput"]["trajectories_per_hour"],
            "wall_seconds": summary["wall_seconds"], "steps": summary["steps"],
            "trajectories": summary["trajectories"]["total"], "effective": summary["trajectories"]["effective"],
            "refused_too_stale": sum("too stale" in t.status_reason for t in consumed),
            "staleness_max": summary["staleness"]["max"], "trained_tokens_by_staleness": summary["staleness"]["tokens"],
            "idle_seconds": summary["idle_seconds"],
            "turns": {"mean": round(sum(turns) / max(len(turns), 1), 2), "max": max(turns, default=0),
                      "min": min(turns, default=0)},
            "policy_errors": sum(str(t.status) == "policy_error" for t in consumed),
            # What generation cost per trajectory trained on: where generation alone sets the pace (a cluster whose
            # trainer has devices of its own), throughput goes as its inverse. The refused groups' tokens and the
            # tokens left out as too stale are in it; so is the cost of each trajectory's length.
            "generated_tokens": generated,
            "generated_tokens_per_effective_trajectory": round(generated / max(summary["trajectories"]["effective"],
                                                                               1), 1),
            **cpu}


def run_long_horizon(*, backend: SandboxBackend, steps: int = STEPS["long_horizon"], pretrain_steps: int = 60) -> dict:
    overrides = {"groups_per_step": 2, "group_size": 4, "max_staleness": 1, "rollout_concurrency": 8,
                 "verify_concurrency": 8, "dynamic_sampling": False, "curriculum": False, "micro_batch_size": 16,
                 "checkpoint_every": 10_000, "eval_tasks_per_domain": 0, "learning_rate": 1e-4}
    taskset, image = _long_horizon_world(tasks=256, verify_concurrency=overrides["verify_concurrency"])
    base_model = _tool_caller(block_size=800, steps=pretrain_steps)
    pool = SandboxPool(backend)
    try:
        pool.warm(image)
        _run_long_horizon(True, steps=WARM_UP_STEPS, taskset=taskset, pool=pool, base_model=base_model,
                          overrides=overrides)  # untimed: see WARM_UP_STEPS
        results = {("partial_on" if partial else "partial_off"): _run_long_horizon(
            partial, steps=steps, taskset=taskset, pool=pool, base_model=base_model, overrides=overrides)
            for partial in (True, False)}
    finally:
        pool.close()
    on, off = results["partial_on"], results["partial_off"]
    return {
        "workload": {"steps": steps, "turn_limits": {str(k): v for k, v in LONG_HORIZON_TURNS.items()},
                     **{k: overrides[k] for k in ("groups_per_step", "group_size", "max_staleness",
                                                  "rollout_concurrency")},
                     "tool": "run_python in a sandbox at every turn", "reward": "a coin flip in a sandboxed grader",
                     "model_parameters": sum(p.numel() for p in base_model.parameters())},
        **results,
        "effective_trajectories_per_hour_ratio": round(on["effective_trajectories_per_hour"]
                                                       / max(off["effective_trajectories_per_hour"], 1e-9), 2),
    }


def run(*, backend: SandboxBackend, steps: int | None = None, environment_scale: float = 0.1,
        pipeline_workloads: tuple[str, ...] = ("standard", "long_horizon"), tool_pretrain_steps: int = 60,
        **_) -> dict:
    """The workloads asked for, each its own comparison."""
    results = {}
    if "standard" in pipeline_workloads:
        results["standard"] = run_standard(backend=backend, steps=steps or STEPS["standard"],
                                           environment_scale=environment_scale)
    if "long_horizon" in pipeline_workloads:
        results["long_horizon"] = run_long_horizon(backend=backend, steps=steps or STEPS["long_horizon"],
                                                   pretrain_steps=tool_pretrain_steps)
    return results


def run_standard(*, backend: SandboxBackend, steps: int = STEPS["standard"], environment_scale: float = 0.1) -> dict:
    overrides = {"groups_per_step": 8, "group_size": 8, "max_staleness": 2, "rollout_concurrency": 16,
                 "verify_concurrency": 48, "dynamic_sampling": False, "curriculum": False, "micro_batch_size": 64,
                 "checkpoint_every": 10_000, "eval_tasks_per_domain": 0}
    template, items = _world(tasks=512, scale=environment_scale, verify_concurrency=overrides["verify_concurrency"])
    model_config = ModelConfig(vocab_size=CharChat().tokenizer.vocab_size, block_size=64, n_layer=4, n_embd=512,
                               n_head=8)
    pool = SandboxPool(backend)
    try:
        pool.warm(template.image)
        _run_mode("async", steps=WARM_UP_STEPS, template=template, items=items, pool=pool, model_config=model_config,
                  overrides=overrides)  # untimed: see WARM_UP_STEPS
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
        "compute_bound_speedup": round(results["sync"]["wall_seconds"] * results["sync"]["machine"]["cores"]
                                       / max(results["sync"]["machine"]["cpu_seconds"], 1e-9), 2),
    }

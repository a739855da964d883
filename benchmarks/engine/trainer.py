"""`bench trainer`: our GRPO trainer against TRL's GRPOTrainer on the same Hugging Face models, reward and data,
side by side in one run, on the CPU or a GPU, in fp32 or bf16: seconds per step, and wall time until the
reward's moving average reaches a target.

The workloads, each run by both trainers:
- `tiny`: a ~0.7M-parameter Llama with a character tokenizer (workers.rl.models.hf_tiny), made here and taught a+b
  (a, b < 30) from a corpus where 30% of the answers are wrong, so both start from the same unreliable base.
  16 prompts × 8 samples a step, at most 4 new tokens, every weight trained, 100 steps.
- `smollm2_lora` (`smollm2` on the command line too): SmolLM2-135M-Instruct (builtin:smollm2-135m-instruct),
  "What is a+b? Answer with just the number." for a, b ≤ 20; 4 prompts × 8 samples, at most 8 new tokens, LoRA
  r=16 on every linear layer, 4 steps (a step is seconds on a CPU, so a few show the speed, not the learning).
- `smollm2_full`: the same, every weight trained. `smollm2_lora_long`: LoRA r=16, 16 prompts × 8 × 64 tokens.
  These two and `--device cuda` are the GPU issue's workloads (issue 27).
- `sft_tiny`, `sft_smollm2`, `dpo_tiny`, `dpo_smollm2` (`sft` and `dpo` on the command line name both of a kind):
  our SFT and DPO trainers against TRL's SFTTrainer and DPOTrainer, interleaved step by step (supervised.py).
`random_weights`: the SmolLM2 architecture from its config with seeded random weights (speed only, where the
weights cannot be had), saved once so both sides load the same model.
Both sides: temperature 1, the reward 1 when the last number of the reply is the sum (our numeric verifier's
rule), group-normalised advantages, clip 0.2 / 0.28, token-level loss, no KL, AdamW at the same constant
learning rate, one update per batch, the same device; bf16 is autocast over fp32 weights on both (TRL's
`bf16=True`, our `precision: bf16`). TRL is set as MEASURED.md found fair on a CPU: no gradient checkpointing,
per-device batch counting completions. Ours runs the product's own path: the model as a run builds it
(models/build.py: in a sync run the transformers engine samples from the trainer's own model, as TRL's does),
the sync pipeline and the numeric verifier; its micro-batches are the device's (one group a pass on the CPU, as
demo-smollm runs; a token budget on a GPU).

`measure_trainer` imports no Django: deploy/gpu's check calls it on a machine without the studio.
"""

from __future__ import annotations

import contextlib
import dataclasses
import random
import re
import shutil
import statistics
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

from benchmarks.engine.supervised import (
    SHORTHANDS,
    SUPERVISED_WORKLOADS,
    compare_supervised,
    supervised_workload,
    tiny_model,
)
from workers.definitions.specs import Limits, parse_spec
from workers.rl.config import GRPOConfig
from workers.rl.models.build import build_model
from workers.rl.models.hf_tiny import make_tiny_hf_model, pretrain_hf_addition
from workers.rl.rollout.grading import LocalVerifier
from workers.rl.session import build_pipeline
from workers.rl.tasks.taskset import TaskSet
from workers.rl.training.tracking import MemoryTracker
from workers.rl.types import TaskTemplate
from workers.sandbox import SandboxImage
from workers.verifiers import Item

WRONG_FRACTION = 0.3  # of the pretraining answers: a base that is right sometimes, so groups carry signal
RUN_ID = "00000000-0000-4000-8000-0000000078a1"
LAST_NUMBER = re.compile(r"-?\d+")
SUM_PROMPT = "What is {a}+{b}? Answer with just the number."
# name: (prompts, samples per prompt, new tokens, LoRA rank, default steps)
SMOLLM2_WORKLOADS = {"smollm2_lora": (4, 8, 8, 16, 4), "smollm2_full": (4, 8, 8, 0, 4),
                     "smollm2_lora_long": (16, 8, 64, 16, 4)}
WORKLOADS = ("tiny", *SMOLLM2_WORKLOADS, *SUPERVISED_WORKLOADS)
TINY_STEPS = 100


@dataclass(frozen=True)
class Workload:
    model_dir: Path
    prompt_template: str  # the user message, with {a} and {b}
    limit: int  # a, b < limit
    prompts: int
    group: int
    new_tokens: int
    learning_rate: float
    lora_rank: int = 0
    lora_alpha: int = 16
    micro_batch_size: int | None = None  # ours on a CPU; None: the whole step in one pass (a GPU: a token budget)

    def problems(self) -> list[tuple[int, int]]:
        problems = [(a, b) for a in range(self.limit) for b in range(self.limit)]
        random.Random(0).shuffle(problems)
        return problems

    def describe(self) -> dict:
        return {"prompt": self.prompt_template, "prompts_per_step": self.prompts, "samples_per_prompt": self.group,
                "max_new_tokens": self.new_tokens, "learning_rate": self.learning_rate, "lora_rank": self.lora_rank,
                "our_micro_batch_size": self.micro_batch_size or self.prompts * self.group}


def _last_number_is(text: str, expected: int) -> bool:
    numbers = LAST_NUMBER.findall(text)
    return bool(numbers) and int(numbers[-1]) == expected


def _reached(history: list[tuple[float, float]], target: float, window: int = 10) -> float | None:
    """Seconds (since the first step began) at which the moving average of the reward first reached target."""
    for index in range(window - 1, len(history)):
        if statistics.fmean(r for _, r in history[index - window + 1:index + 1]) >= target:
            return round(history[index][0], 1)
    return None


def _summary(step_seconds: list[float], history: list[tuple[float, float]], target: float) -> dict:
    steady = step_seconds[1:] or step_seconds  # the first step pays for warm-up on both sides
    return {"seconds_per_step": round(statistics.median(steady), 4), "steps": len(step_seconds),
            "wall_seconds": round(sum(step_seconds), 1),
            "reward_first_10": round(statistics.fmean(r for _, r in history[:10]), 3),
            "reward_last_10": round(statistics.fmean(r for _, r in history[-10:]), 3),
            "seconds_to_target": _reached(history, target)}


def _ours(work: Workload, steps: int, target: float, *, device: str = "cpu", dtype: str = "fp32") -> dict:
    model_dir = work.model_dir
    items = {f"{a}+{b}": Item(key=f"{a}+{b}", inputs={"a": a, "b": b}, hidden={"answer": a + b})
             for a, b in work.problems()}
    verifier = parse_spec("verifier", {"layers": [{"name": "number", "kind": "exact", "checks": [
        {"type": "numeric", "name": "sum", "reference": "{answer}", "abs_tolerance": 0, "rel_tolerance": 0}]}]})
    template = TaskTemplate(key="task_template/add@1", domain="arithmetic", system_prompt="",
                            prompt_template=work.prompt_template, tools=(),
                            limits=Limits(max_turns=1, max_tokens=work.new_tokens, max_seconds=60),
                            image=SandboxImage(key="sandbox_image/none@1", layers=()), verifier_key="verifier/sum@1",
                            verifier_spec=verifier)
    config = GRPOConfig.resolve({
        "mode": "sync", "groups_per_step": work.prompts, "group_size": work.group, "dynamic_sampling": False,
        "curriculum": False, "learning_rate": work.learning_rate,
        "micro_batch_size": work.micro_batch_size or work.prompts * work.group,
        "clip_low": 0.2, "clip_high": 0.28, "checkpoint_every": 10_000, "eval_tasks_per_domain": 0,
        "model": str(model_dir), "engine": "transformers", "lora_rank": work.lora_rank,
        "lora_alpha": work.lora_alpha, "device": device, "precision": dtype})
    model = build_model(config, None, models_dir=model_dir.parent, pretrain_seconds=0)  # as a run builds it
    tracker = MemoryTracker()
    with tempfile.TemporaryDirectory() as checkpoints:
        pipeline = build_pipeline(run_id=RUN_ID, config=config, total_steps=steps,
                                  tasks=TaskSet.single_template(template, items), model=model, tool_runner=None,
                                  verifier=LocalVerifier(pool=None), tracker=tracker, checkpoint_dir=Path(checkpoints))
        pipeline.run()
    model.close()
    step_seconds = [s["points"]["trainer/step_seconds"] for s in tracker.steps]
    elapsed, history = 0.0, []
    for seconds, step in zip(step_seconds, tracker.steps, strict=True):
        elapsed += seconds
        history.append((elapsed, step["points"]["reward/mean"]))
    return _summary(step_seconds, history, target)


def _trl(work: Workload, steps: int, target: float, *, device: str = "cpu", dtype: str = "fp32") -> dict:
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig
    from trl import GRPOTrainer as TRLTrainer

    model_dir = work.model_dir
    rows = [{"prompt": [{"role": "user", "content": work.prompt_template.format(a=a, b=b)}], "answer": a + b}
            for a, b in work.problems()]

    def exact_sum(completions, answer, **_):
        return [1.0 if _last_number_is(completion[0]["content"], expected) else 0.0
                for completion, expected in zip(completions, answer, strict=True)]

    peft_config = None
    if work.lora_rank:
        from peft import LoraConfig

        peft_config = LoraConfig(r=work.lora_rank, lora_alpha=work.lora_alpha, lora_dropout=0.0,
                                 target_modules="all-linear", task_type="CAUSAL_LM")

    class StepClock(TrainerCallback):
        def __init__(self):
            self.seconds, self._started = [], 0.0

        def on_step_begin(self, args, state, control, **kwargs):
            self._started = time.monotonic()

        def on_step_end(self, args, state, control, **kwargs):
            self.seconds.append(time.monotonic() - self._started)

    clock = StepClock()
    with tempfile.TemporaryDirectory() as output:
        args = GRPOConfig(output_dir=output, per_device_train_batch_size=work.prompts * work.group,
                          num_generations=work.group, max_completion_length=work.new_tokens,
                          learning_rate=work.learning_rate, lr_scheduler_type="constant",
                          warmup_steps=0, epsilon=0.2, epsilon_high=0.28, beta=0.0, temperature=1.0,
                          bf16=dtype == "bf16", fp16=False, gradient_checkpointing=False, max_steps=steps,
                          logging_steps=1, report_to=[], save_strategy="no", use_cpu=device == "cpu", seed=0,
                          dataloader_num_workers=0)
        trainer = TRLTrainer(model=str(model_dir), reward_funcs=exact_sum, args=args,
                             train_dataset=Dataset.from_list(rows),
                             processing_class=AutoTokenizer.from_pretrained(model_dir), callbacks=[clock],
                             peft_config=peft_config)
        with contextlib.redirect_stdout(sys.stderr):  # TRL prints its logs; this command's stdout is the JSON
            trainer.train()
        rewards = [entry["reward"] for entry in trainer.state.log_history if "reward" in entry]
    elapsed, history = 0.0, []
    for seconds, reward in zip(clock.seconds, rewards, strict=False):
        elapsed += seconds
        history.append((elapsed, reward))
    return _summary(clock.seconds, history, target)


def _attempt(side, *args, **kwargs) -> dict:
    """One side's summary, or what stopped it: the other side and the other workloads still run."""
    try:
        return side(*args, **kwargs)
    except Exception as error:  # noqa: BLE001 - reported in the JSON, the traceback on stderr
        traceback.print_exc(file=sys.stderr)
        return {"error": f"{type(error).__name__}: {error}"[:2000]}


def _compare(work: Workload, steps: int, target: float, *, device: str, dtype: str, compare_trl: bool,
             **extra) -> dict:
    result = {"workload": {**work.describe(), "steps": steps, **extra}}
    result["ours"] = _attempt(_ours, work, steps, target, device=device, dtype=dtype)
    if not compare_trl:
        return result
    result["trl"] = _attempt(_trl, work, steps, target, device=device, dtype=dtype)
    ours, trl = result["ours"].get("seconds_per_step"), result["trl"].get("seconds_per_step")
    if ours and trl:
        result["seconds_per_step_ratio_trl_over_ours"] = round(trl / ours, 2)
    return result


def random_weights_model(model_dir: Path, into: Path) -> Path:
    """A copy of `model_dir`'s config and tokenizer with seeded random weights in fp32 (the same model on every
    machine), saved so that both trainers load it as a local model: `model_dir` needs no weights."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    into.mkdir(parents=True, exist_ok=True)
    for path in Path(model_dir).iterdir():
        if path.is_file() and not path.name.endswith((".safetensors", ".bin", ".pt", ".gguf")) \
                and not path.name.endswith(".safetensors.index.json"):
            shutil.copy(path, into / path.name)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(into), dtype=torch.float32)
    model.save_pretrained(into)
    return into


def smollm2_workload(name: str, model_dir: Path) -> tuple[Workload, int]:
    prompts, group, new_tokens, lora_rank, steps = SMOLLM2_WORKLOADS[name]
    # micro-batches of one group on a CPU, as demo-smollm runs: each computes its prompt once
    return Workload(model_dir, SUM_PROMPT, limit=21, prompts=prompts, group=group, new_tokens=new_tokens,
                    learning_rate=2e-4, lora_rank=lora_rank, lora_alpha=32 if lora_rank else 16,
                    micro_batch_size=group), steps


def measure_trainer(*, device: str = "cpu", dtype: str = "fp32", workloads: list[str] | tuple[str, ...] = (
        "tiny", "smollm2_lora"), random_weights: bool = False, model_dir: str | None = None,
        steps: int | None = None, smollm_steps: int | None = None, pretrain_steps: int = 1500,
        target_reward: float = 0.6, compare_trl: bool = True, sizes: dict | None = None,
        model_description: str = "") -> dict:
    """Ours against TRL on each of `workloads` (WORKLOADS; `smollm2` names smollm2_lora): result["workloads"]
    [name] holds each side's seconds_per_step and their ratio. `model_dir`: SmolLM2's directory (config and
    tokenizer; weights too unless `random_weights`), needed by the smollm2 workloads only. `steps`: every
    workload's steps (default: tiny 100, smollm2 4); `smollm_steps`, the smollm2 ones' before it. `sizes`:
    prompts / group / new_tokens replacing every workload's own (a dry run's small sizes)."""
    names = [expanded for name in workloads
             for expanded in SHORTHANDS.get(name, ("smollm2_lora" if name == "smollm2" else name,))]
    unknown = sorted(set(names) - set(WORKLOADS))
    if unknown:
        raise ValueError(f"unknown workloads {unknown}: the bench has {', '.join(WORKLOADS)}")
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise ValueError("device cuda asked for, but torch sees no CUDA device here")
    result = {"device": device, "dtype": dtype, "random_weights": random_weights,
              "target_reward_moving_average": target_reward, "workloads": {}}
    sized = (lambda work: dataclasses.replace(work, **sizes)) if sizes else (lambda work: work)
    common = {"device": device, "dtype": dtype, "compare_trl": compare_trl}
    with tempfile.TemporaryDirectory() as scratch:
        if "tiny" in names:
            model = make_tiny_hf_model(Path(scratch) / "tiny-llama", hidden_size=128, layers=4, heads=4,
                                       max_positions=64)
            started = time.monotonic()
            report = pretrain_hf_addition(model, steps=pretrain_steps, limit=30, wrong_fraction=WRONG_FRACTION)
            tiny = sized(Workload(model, "{a}+{b}=", limit=30, prompts=16, group=8, new_tokens=4,
                                  learning_rate=2e-4))
            result["workloads"]["tiny"] = _compare(
                tiny, steps or TINY_STEPS, target_reward, **common,
                pretraining={**report, "seconds": round(time.monotonic() - started, 1)},
                model="LlamaForCausalLM 128 hidden × 4 layers, character tokenizer (workers.rl.models.hf_tiny)")
        smollm = [name for name in names if name in SMOLLM2_WORKLOADS or name.endswith("_smollm2")]
        directory = None
        if smollm:
            if model_dir is None:
                raise ValueError("the smollm2 workloads need model_dir: SmolLM2's directory (config and tokenizer, "
                                 "and weights unless random_weights)")
            directory = Path(model_dir)
            if random_weights:
                directory = random_weights_model(directory, Path(scratch) / "smollm2-random")
            described = (model_description or directory.name) + (" (random weights)" if random_weights else "")
            for name in smollm:
                if name not in SMOLLM2_WORKLOADS:
                    continue
                work, default_steps = smollm2_workload(name, directory)
                result["workloads"][name] = _compare(sized(work), smollm_steps or steps or default_steps,
                                                     target_reward, **common, model=described)
        supervised = [name for name in names if name in SUPERVISED_WORKLOADS]
        tiny_dir = tiny_model(Path(scratch) / "tiny-llama-sft") if any(n.endswith("_tiny") for n in supervised) \
            else None
        for name in supervised:
            work, default_steps = supervised_workload(name, tiny_dir=tiny_dir, smollm_dir=directory)
            chosen_steps = (smollm_steps if name.endswith("_smollm2") else None) or steps or default_steps
            result["workloads"][name] = _attempt(compare_supervised, work, chosen_steps, device=device, dtype=dtype,
                                                 compare_trl=compare_trl)
    return result


def run(*, models_dir: Path, steps: int | None = None, smollm_steps: int = 4, target_reward: float = 0.6,
        pretrain_steps: int = 1500, workloads: tuple[str, ...] = ("tiny", "smollm2_lora"), device: str = "cpu",
        dtype: str = "fp32", random_weights: bool = False, **_) -> dict:
    """`manage.py bench trainer`: measure_trainer on the packaged SmolLM2 (converted on first use)."""
    from workers.rl.models.packaged import SMOLLM2_135M, converted

    model_dir = None
    if any(name not in ("tiny", "sft", "dpo") and not name.endswith("_tiny") for name in workloads) or \
            {"sft", "dpo"} & set(workloads):
        model_dir = str(converted(SMOLLM2_135M, models_dir))
    return measure_trainer(device=device, dtype=dtype, workloads=workloads, random_weights=random_weights,
                           model_dir=model_dir, steps=steps, smollm_steps=smollm_steps,
                           pretrain_steps=pretrain_steps, target_reward=target_reward,
                           model_description=SMOLLM2_135M.description)

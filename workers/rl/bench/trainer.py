"""`bench trainer`: our GRPO trainer against TRL's GRPOTrainer on the same Hugging Face models, reward and data,
side by side in one run: seconds per step, and wall time until the reward's moving average reaches a target.

Two workloads, each run by both trainers:
- `tiny`: a ~0.7M-parameter Llama with a character tokenizer (workers.rl.models.hf_tiny), made here and taught a+b
  (a, b < 30) from a corpus where 30% of the answers are wrong, so both start from the same unreliable base.
  16 prompts × 8 samples a step, at most 4 new tokens, every weight trained, `--steps` steps (100).
- `smollm2`: SmolLM2-135M-Instruct (builtin:smollm2-135m-instruct), "What is a+b? Answer with just the
  number." for a, b ≤ 20; 4 prompts × 8 samples, at most 8 new tokens, LoRA r=16 on every linear layer,
  `--smollm-steps` steps (4: a step is seconds here, so a few show the speed, not the learning).
Both sides: temperature 1, the reward 1 when the last number of the reply is the sum (our numeric verifier's
rule), group-normalised advantages, clip 0.2 / 0.28, token-level loss, no KL, AdamW at the same constant
learning rate, one update per batch. TRL is set as MEASURED.md found fair on a CPU: no bf16, no gradient
checkpointing, per-device batch counting completions. Ours runs the product's own path: the model as a run
builds it (models/build.py: in a sync run the transformers engine samples from the trainer's own model, as
TRL's does), the sync pipeline and the numeric verifier.
"""

from __future__ import annotations

import contextlib
import random
import re
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from workers.definitions import validate_spec
from workers.rl.config import RunConfig
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
    micro_batch_size: int | None = None  # ours; None: the whole step in one pass

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


def _ours(work: Workload, steps: int, target: float) -> dict:
    model_dir = work.model_dir
    items = {f"{a}+{b}": Item(key=f"{a}+{b}", inputs={"a": a, "b": b}, hidden={"answer": a + b})
             for a, b in work.problems()}
    verifier = validate_spec("verifier", {"layers": [{"name": "number", "kind": "exact", "checks": [
        {"type": "numeric", "name": "sum", "reference": "{answer}", "abs_tolerance": 0, "rel_tolerance": 0}]}]})
    template = TaskTemplate(key="task_template/add@1", domain="arithmetic", system_prompt="",
                            prompt_template=work.prompt_template, tools=(),
                            limits={"max_turns": 1, "max_tokens": work.new_tokens, "max_seconds": 60},
                            image=SandboxImage(key="sandbox_image/none@1", layers=()), verifier_key="verifier/sum@1",
                            verifier_spec=verifier)
    config = RunConfig.resolve({
        "mode": "sync", "groups_per_step": work.prompts, "group_size": work.group, "dynamic_sampling": False,
        "curriculum": False, "learning_rate": work.learning_rate,
        "micro_batch_size": work.micro_batch_size or work.prompts * work.group,
        "clip_low": 0.2, "clip_high": 0.28, "checkpoint_every": 10_000, "eval_tasks_per_domain": 0,
        "model": str(model_dir), "engine": "transformers", "lora_rank": work.lora_rank,
        "lora_alpha": work.lora_alpha})
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


def _trl(work: Workload, steps: int, target: float) -> dict:
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
                          warmup_steps=0, epsilon=0.2, epsilon_high=0.28, beta=0.0, temperature=1.0, bf16=False,
                          fp16=False, gradient_checkpointing=False, max_steps=steps, logging_steps=1, report_to=[],
                          save_strategy="no", use_cpu=True, seed=0, dataloader_num_workers=0)
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


def _compare(work: Workload, steps: int, target: float, **extra) -> dict:
    ours = _ours(work, steps, target)
    trl = _trl(work, steps, target)
    return {"workload": {**work.describe(), "steps": steps, **extra}, "ours": ours, "trl": trl,
            "seconds_per_step_ratio_trl_over_ours": round(trl["seconds_per_step"] / ours["seconds_per_step"], 2)}


def run(*, models_dir: Path, steps: int = 100, smollm_steps: int = 4, target_reward: float = 0.6,
        pretrain_steps: int = 1500, workloads: tuple[str, ...] = ("tiny", "smollm2"), **_) -> dict:
    from ..models.packaged import SMOLLM2_135M, converted

    result = {"target_reward_moving_average": target_reward}
    if "tiny" in workloads:
        with tempfile.TemporaryDirectory() as directory:
            model_dir = make_tiny_hf_model(Path(directory) / "tiny-llama", hidden_size=128, layers=4, heads=4,
                                           max_positions=64)
            started = time.monotonic()
            report = pretrain_hf_addition(model_dir, steps=pretrain_steps, limit=30, wrong_fraction=WRONG_FRACTION)
            tiny = Workload(model_dir, "{a}+{b}=", limit=30, prompts=16, group=8, new_tokens=4, learning_rate=2e-4)
            result["tiny"] = _compare(
                tiny, steps, target_reward, pretraining={**report, "seconds": round(time.monotonic() - started, 1)},
                model="LlamaForCausalLM 128 hidden × 4 layers, character tokenizer (workers.rl.models.hf_tiny)")
    if "smollm2" in workloads:
        smollm = Workload(converted(SMOLLM2_135M, models_dir), "What is {a}+{b}? Answer with just the number.",
                          limit=21, prompts=4, group=8, new_tokens=8, learning_rate=2e-4, lora_rank=16, lora_alpha=32,
                          micro_batch_size=8)  # as demo-smollm runs it: one group a pass, its prompt computed once
        result["smollm2"] = _compare(smollm, smollm_steps, target_reward, model=SMOLLM2_135M.description)
    return result

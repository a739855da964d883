"""`bench trainer --workloads sft dpo`: our SFT and DPO trainers against TRL's SFTTrainer and DPOTrainer on the
same model, data and batch, interleaved step by step in one process: seconds per step, tokens per second, and
both sides' first-step losses (which must match: the same rows, masked the same way, under the same loss).

The workloads (`sft` names sft_tiny and sft_smollm2, `dpo` the two DPO ones):
- `*_tiny`: the bench's tiny Llama (workers.rl.models.hf_tiny, 128 hidden × 4 layers, random weights), every weight
  trained; 16 rows a step.
- `*_smollm2`: SmolLM2-135M-Instruct with LoRA r=16 on every linear layer; 8 rows a step.
The data (`addition_conversations`, `addition_preferences`): SFT conversations where the assistant calls
run_python, reads the tool's result and answers (the tool result and the prompt are context, masked out); DPO
pairs answering "What is a+b?" rightly (chosen) and wrongly (rejected). A step trains on every row of the
dataset on both sides, so which rows a sampler draws cannot make the losses differ.

Interleaved: TRL trains, and at the end of each of its steps (a callback, after TRL's step is timed) ours takes
its step on the same rows, so both sides see the same load on a shared machine. TRL is set as MEASURED.md found
fair on a CPU: no gradient checkpointing, no packing, AdamW at the same constant learning rate, the same
clipping, fp32 (or bf16 autocast on both). DPO on both sides computes the reference's log-probabilities once
before training (TRL's precompute_ref_log_probs), outside the timed steps. TRL masks the assistant's tokens
with a chat template carrying `{% generation %}` markers that renders exactly as the model's own (checked).
"""

from __future__ import annotations

import contextlib
import json
import random
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from workers.rl.config import config_class
from workers.rl.models.build import build_model
from workers.rl.models.hf_tiny import make_tiny_hf_model
from workers.rl.training.data_files import read_dataset
from workers.rl.training.supervised import DPOTrainer, SFTTrainer
from workers.rl.training.supervised_pipeline import tokenize_row

# name: (kind, rows a step, default steps, LoRA rank, learning rate)
SUPERVISED_WORKLOADS = {"sft_tiny": ("sft", 16, 20, 0, 1e-3), "sft_smollm2": ("sft", 8, 4, 16, 2e-4),
                        "dpo_tiny": ("dpo", 16, 20, 0, 1e-3), "dpo_smollm2": ("dpo", 8, 4, 16, 2e-4)}
SHORTHANDS = {"sft": ("sft_tiny", "sft_smollm2"), "dpo": ("dpo_tiny", "dpo_smollm2")}
# The tiny model's ChatML with TRL's assistant markers: it renders exactly as hf_tiny.CHAT_TEMPLATE.
TINY_TEMPLATE_MARKED = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{% if message['role'] == 'assistant' %}"
    "{% generation %}{{ message['content'] }}<|im_end|>\n{% endgeneration %}{% else %}{{ message['content'] }}"
    "<|im_end|>\n{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# SmolLM2-Instruct's template (a default system message, then ChatML) with the same markers.
SMOLLM2_TEMPLATE_MARKED = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}{{ '<|im_start|>' + message['role'] + '\n' }}{% if message['role'] == 'assistant' %}"
    "{% generation %}{{ message['content'] + '<|im_end|>' + '\n' }}{% endgeneration %}{% else %}"
    "{{ message['content'] + '<|im_end|>' + '\n' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def addition_conversations(count: int, *, seed: int = 0) -> list[dict]:
    """SFT rows: the assistant calls run_python for a+b, reads the result, answers (tool_calls in OpenAI's form)."""
    rng = random.Random(seed)
    rows = []
    for _ in range(count):
        a, b = rng.randrange(100), rng.randrange(100)
        call = {"type": "function", "function": {"name": "run_python", "arguments": {"code": f"print({a}+{b})"}}}
        rows.append({"messages": [{"role": "user", "content": f"What is {a}+{b}? Use the tool."},
                                  {"role": "assistant", "content": "", "tool_calls": [call]},
                                  {"role": "tool", "content": str(a + b)},
                                  {"role": "assistant", "content": f"The answer is {a + b}."}],
                     "provenance": {"source": "bench"}})
    return rows


def addition_preferences(count: int, *, seed: int = 0) -> list[dict]:
    """DPO rows: "What is a+b?" answered rightly (chosen) and off by a little (rejected)."""
    rng = random.Random(seed)
    rows = []
    for _ in range(count):
        a, b = rng.randrange(100), rng.randrange(100)
        wrong = a + b + rng.choice([-10, -1, 1, 2, 10])
        rows.append({"prompt": [{"role": "user", "content": f"What is {a}+{b}?"}],
                     "chosen": [{"role": "assistant", "content": f"{a}+{b} = {a + b}."}],
                     "rejected": [{"role": "assistant", "content": f"{a}+{b} = {wrong}."}],
                     "provenance": {"source": "bench"}})
    return rows


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


@dataclass(frozen=True)
class SupervisedWorkload:
    kind: str
    model_dir: Path
    marked_template: str  # the model's chat template with TRL's {% generation %} markers
    rows: int
    learning_rate: float
    lora_rank: int = 0

    def describe(self) -> dict:
        return {"kind": self.kind, "rows_per_step": self.rows, "learning_rate": self.learning_rate,
                "lora_rank": self.lora_rank}


def _data(work: SupervisedWorkload, directory: Path) -> Path:
    rows = addition_conversations(work.rows) if work.kind == "sft" else addition_preferences(work.rows)
    return write_jsonl(directory / f"{work.kind}.jsonl", rows)


def our_trainer(work: SupervisedWorkload, data: Path, *, steps: int, device: str = "cpu", dtype: str = "fp32"):
    """(trainer, the step's rows) as an SFT or DPO run builds them (models/build.py without an engine), the DPO
    reference precomputed."""
    config = config_class(work.kind).resolve({
        "model": str(work.model_dir), "lora_rank": work.lora_rank,
        "lora_alpha": 2 * work.lora_rank if work.lora_rank else 16, "device": device, "precision": dtype,
        "learning_rate": work.learning_rate, "batch_size": work.rows, "micro_batch_size": work.rows,
        "dataset": str(data)})
    model = build_model(config, None, models_dir=work.model_dir.parent, pretrain_seconds=0, sampling=False)
    rows = [tokenize_row(model.chat, row) for row in read_dataset(data, work.kind)]
    trainer = (SFTTrainer if work.kind == "sft" else DPOTrainer)(model.policy, config=config, total_steps=steps)
    if work.kind == "dpo":
        trainer.precompute_reference(rows)
    return trainer, rows


def trl_trainer(work: SupervisedWorkload, data: Path, output: str, *, steps: int, device: str = "cpu",
                dtype: str = "fp32", callbacks=()):
    """TRL's SFTTrainer or DPOTrainer on the same model, rows and batch (see the module's docstring)."""
    from datasets import Dataset
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(work.model_dir)
    rows = [{k: v for k, v in json.loads(line).items() if k != "provenance"} for line in data.read_text().split("\n")
            if line]
    if work.kind == "sft":
        for row in rows:  # TRL takes tool calls as structured fields; ours wrote them as text: the same text here
            for message in row["messages"]:
                if message.get("tool_calls"):
                    function = message.pop("tool_calls")[0]["function"]
                    payload = json.dumps({"name": function["name"], "arguments": function["arguments"]})
                    message["content"] = f"<tool_call>\n{payload}\n</tool_call>"
    _check_marked_template(tokenizer, work.marked_template, rows)
    tokenizer.chat_template = work.marked_template
    peft_config = None
    if work.lora_rank:
        from peft import LoraConfig

        peft_config = LoraConfig(r=work.lora_rank, lora_alpha=2 * work.lora_rank, lora_dropout=0.0,
                                 target_modules="all-linear", task_type="CAUSAL_LM")
    common = dict(output_dir=output, per_device_train_batch_size=work.rows, gradient_accumulation_steps=1,
                  learning_rate=work.learning_rate, lr_scheduler_type="constant", warmup_steps=0, max_steps=steps,
                  logging_steps=1, report_to=[], save_strategy="no", use_cpu=device == "cpu", seed=0,
                  bf16=dtype == "bf16", fp16=False, gradient_checkpointing=False, dataloader_num_workers=0,
                  max_length=None)
    if work.kind == "sft":
        from trl import SFTConfig
        from trl import SFTTrainer as TRLSFTTrainer

        args = SFTConfig(**common, assistant_only_loss=True, packing=False, padding_free=False)
        return TRLSFTTrainer(model=str(work.model_dir), args=args, train_dataset=Dataset.from_list(rows),
                             processing_class=tokenizer, peft_config=peft_config, callbacks=list(callbacks))
    from trl import DPOConfig
    from trl import DPOTrainer as TRLDPOTrainer

    args = DPOConfig(**common, beta=0.1, loss_type="sigmoid", precompute_ref_log_probs=True)
    return TRLDPOTrainer(model=str(work.model_dir), args=args, train_dataset=Dataset.from_list(rows),
                         processing_class=tokenizer, peft_config=peft_config, callbacks=list(callbacks))


def _check_marked_template(tokenizer, marked: str, rows: list[dict]) -> None:
    """TRL must read the very text our side reads: the marked template renders each row as the model's own."""
    for row in rows[:4]:
        messages = row.get("messages") or row["prompt"] + row["chosen"]
        own = tokenizer.apply_chat_template(messages, tokenize=False)
        theirs = tokenizer.apply_chat_template(messages, tokenize=False, chat_template=marked)
        if own != theirs:
            raise ValueError(f"the marked chat template renders otherwise than the model's own:\n{own!r}\n{theirs!r}")


def compare_supervised(work: SupervisedWorkload, steps: int, *, device: str = "cpu", dtype: str = "fp32",
                       compare_trl: bool = True) -> dict:
    """Ours and TRL's on `work`, interleaved step by step; each side's seconds per step (median after the first),
    tokens per second, and first-step loss (DPO: also the first step's log-probabilities, which the loss of a
    step where the policy is still the reference, ln 2, does not show)."""
    from transformers import TrainerCallback

    with tempfile.TemporaryDirectory() as scratch:
        data = _data(work, Path(scratch))
        ours, rows = our_trainer(work, data, steps=steps, device=device, dtype=dtype)
        our_steps = []

        def our_step():
            stats = ours.train(rows)
            our_steps.append(stats)

        result = {"workload": {**work.describe(), "steps": steps}}
        if not compare_trl:
            for _ in range(steps):
                our_step()
            result["ours"] = _side([s.seconds for s in our_steps], [s.tokens for s in our_steps],
                                   our_steps[0].loss, our_steps[0].extra)
            return result

        class Interleave(TrainerCallback):
            def __init__(self):
                self.seconds, self._started = [], 0.0

            def on_step_begin(self, args, state, control, **kwargs):
                self._started = time.monotonic()

            def on_step_end(self, args, state, control, **kwargs):
                self.seconds.append(time.monotonic() - self._started)
                our_step()  # after TRL's step is timed: the two sides alternate

        clock = Interleave()
        trl = trl_trainer(work, data, scratch, steps=steps, device=device, dtype=dtype, callbacks=[clock])
        with contextlib.redirect_stdout(sys.stderr):  # TRL prints its logs; this command's stdout is the JSON
            trl.train()
        logs = [entry for entry in trl.state.log_history if "loss" in entry and "train_runtime" not in entry]
        tokens = [s.tokens for s in our_steps]  # the same rows and text on both sides: the same tokens
        first = logs[0]
        result["ours"] = _side([s.seconds for s in our_steps], tokens, our_steps[0].loss, our_steps[0].extra)
        trl_extra = ({"logprob/chosen": first.get("logps/chosen"), "logprob/rejected": first.get("logps/rejected")}
                     if work.kind == "dpo" else {})
        result["trl"] = _side(clock.seconds, tokens, first["loss"], trl_extra)
        # Every step trains on the same rows on both sides: with every weight trained (no LoRA, whose adapters
        # start from each side's own random draw), the later steps' losses check the gradients and the updates.
        result["ours"]["losses"] = [round(s.loss, 6) for s in our_steps]
        result["trl"]["losses"] = [round(entry["loss"], 6) for entry in logs]
        result["seconds_per_step_ratio_trl_over_ours"] = round(
            result["trl"]["seconds_per_step"] / result["ours"]["seconds_per_step"], 2)
        result["first_step_loss_difference"] = abs(result["trl"]["first_step_loss"] -
                                                   result["ours"]["first_step_loss"])
    return result


def _side(seconds: list[float], tokens: list[int], first_loss: float, extra: dict) -> dict:
    steady = seconds[1:] or seconds  # the first step pays for warm-up on both sides
    side = {"seconds_per_step": round(statistics.median(steady), 4), "steps": len(seconds),
            "tokens_per_second": round(statistics.median(t / s for t, s in zip(tokens[1:] or tokens, steady,
                                                                                  strict=False)), 1),
            "first_step_loss": first_loss}
    for name in ("logprob/chosen", "logprob/rejected"):
        if extra.get(name) is not None:
            side[f"first_step_{name.replace('/', '_')}"] = extra[name]
    return side


def supervised_workload(name: str, *, tiny_dir: Path | None, smollm_dir: Path | None) -> tuple[SupervisedWorkload,
                                                                                                 int]:
    kind, rows, steps, lora_rank, learning_rate = SUPERVISED_WORKLOADS[name]
    if name.endswith("_tiny"):
        return SupervisedWorkload(kind, tiny_dir, TINY_TEMPLATE_MARKED, rows, learning_rate), steps
    return SupervisedWorkload(kind, smollm_dir, SMOLLM2_TEMPLATE_MARKED, rows, learning_rate,
                              lora_rank=lora_rank), steps


def tiny_model(directory: Path) -> Path:
    """The bench's tiny Llama (random weights; its chat template is hf_tiny's)."""
    return make_tiny_hf_model(directory, hidden_size=128, layers=4, heads=4, max_positions=256)

"""The second demo: tasks a real 135M-parameter instruction-tuned model can partly do, for LoRA GRPO on a CPU.

SmolLM2-135M-Instruct (builtin:smollm2-135m-instruct) knows the formats and is unreliable: it writes fenced
Python functions, answers "17+25 = 32", and has never seen our tool instructions. Three domains, each short
enough that a step on two cores takes seconds, not minutes:
- smol-sums: a+b for a, b up to 20, answered with just the number (the verifier reads the last number).
- smol-python: the easier families of the coding domain, one fenced solution.py, hidden unittest tests.
- smol-tools: an expression to evaluate with the run_python tool, then the number.
The bundle carries the run settings these are sized for (bundle `run_config`), so
`manage.py train --bundle demo-smollm --steps N` needs no --set.
"""

import random

from workers.rl.packaged import SMOLLM2_135M
from workers.rl.tools import RUN_PYTHON_TOOL

from . import coding
from .draft import Draft

SUM_LIMIT = 20  # a, b in 0..20: 441 sums
EXPRESSIONS = 300
SEED = 135
# The coding families with one short function a small model writes in a few lines.
EASY_FAMILIES = {"sum-multiples", "clamp", "fizzbuzz", "digit-sum", "above-threshold", "long-words", "divisors"}

RUN_CONFIG = {
    "model": SMOLLM2_135M.name, "engine": "transformers", "lora_rank": 16, "lora_alpha": 32,
    "learning_rate": 2e-4, "groups_per_step": 4, "group_size": 8, "rollout_concurrency": 8,
    "max_staleness": 1, "micro_batch_size": 8, "eval_tasks_per_domain": 16, "checkpoint_every": 10,
}


def sum_instances() -> list[dict]:
    return [{"key": f"sum-{a:02d}-{b:02d}", "inputs": {"a": a, "b": b}, "hidden": {"answer": a + b}}
            for a in range(SUM_LIMIT + 1) for b in range(SUM_LIMIT + 1)]


def expression_instances() -> list[dict]:
    rng, seen, items = random.Random(SEED), set(), []
    while len(items) < EXPRESSIONS:
        a, b, c = rng.randint(11, 99), rng.randint(11, 99), rng.randint(101, 999)
        expression = f"{a} * {b} + {c}"
        if expression not in seen:
            seen.add(expression)
            items.append({"key": f"expr-{a}-{b}-{c}", "inputs": {"expression": expression},
                          "hidden": {"answer": a * b + c}})
    return items


def python_instances() -> list[dict]:
    return [item for item in coding.instances() if item["inputs"]["family"] in EASY_FAMILIES]


def drafts() -> list[Draft]:
    sums = {
        "prompt_template": "What is {a}+{b}? Answer with just the number.",
        "sandbox_image": "python-3-11",
        "verifier": "numeric-exact",
        "limits": {"max_turns": 1, "max_tokens": 10, "max_seconds": 10},
    }
    functions = {
        "system_prompt": "You write small, correct Python functions. Reply with the complete solution.py in one "
                         "```python block.",
        "prompt_template": coding.PROMPT,
        "sandbox_image": "python-3-11",
        "verifier": "python-unit-tests",
        "limits": {"max_turns": 1, "max_tokens": 128, "max_seconds": 60},
    }
    tool_use = {
        "system_prompt": "You have a Python sandbox. Call run_python to compute, then reply with just the number.",
        "prompt_template": "What is {expression}? Compute it with run_python first, then answer with just the "
                           "number.",
        "tools": [RUN_PYTHON_TOOL],
        "sandbox_image": "python-3-11",
        "verifier": "numeric-exact",
        "limits": {"max_turns": 2, "max_tokens": 64, "max_seconds": 60},
    }
    return [
        Draft("task_template", "smol-sum", "a+b for a, b up to 20, answered with just the number.", sums,
              sum_instances()),
        Draft("task_template", "smol-functions", "The coding domain's easier families, one fenced function, "
              "no tools.", functions, python_instances()),
        Draft("task_template", "smol-run-python", "An expression computed with the run_python tool, then the "
              "number.", tool_use, expression_instances()),
        Draft("domain", "smol-sums", "Short sums for a small real model.",
              {"sampling_weight": 4.0, "templates": [{"template": "smol-sum", "weight": 1.0}]}),
        Draft("domain", "smol-python", "Small Python functions, hidden unit tests.",
              {"sampling_weight": 1.0, "templates": [{"template": "smol-functions", "weight": 1.0}]}),
        Draft("domain", "smol-tools", "A tool call to run_python before answering.",
              {"sampling_weight": 1.0, "templates": [{"template": "smol-run-python", "weight": 1.0}]}),
        Draft("bundle", "demo-smollm", "The real-model demo: SmolLM2-135M-Instruct, LoRA GRPO on the CPU.",
              {"members": ["domain/smol-sums@latest", "domain/smol-python@latest", "domain/smol-tools@latest"],
               "run_config": RUN_CONFIG}),
    ]

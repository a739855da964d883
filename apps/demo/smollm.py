"""The second demo: tasks a real 135M-parameter instruction-tuned model can partly do, for LoRA GRPO on a CPU.

SmolLM2-135M-Instruct (builtin:smollm2-135m-instruct) knows the formats and is unreliable: it writes fenced
Python functions, answers "17+25 = 32", and has never seen our tool instructions. Three domains, each short
enough that a step on two cores takes seconds, not minutes:
- smol-sums: a+b for a, b up to 20, answered with just the number. The verifier (number-only) reads the last
  number and evaluates nothing: numeric-exact's math layer scored a restated question ("To solve 19+14, we")
  as right, and the model learned that in a dozen steps.
- smol-python: one-line functions (x * a + b, divisibility, counting, slicing, vowels), one fenced solution.py,
  hidden unittest tests. It writes the easiest right nearly always and the others sometimes: room to rise.
  (The coding domain's families are beyond it: 0 of 16 at the start, and no signal to learn from.)
- smol-tools: an expression to evaluate with the run_python tool, then the number. The template's examples show
  the call made once, as an earlier exchange: described in the prompt instead, it was never made (0 tool calls
  in 88 rollouts of a 12-step run).
The bundle carries the run settings these are sized for (bundle `run_config`), so
`manage.py train --bundle demo-smollm --steps N` needs no --set.
"""

import random
from collections.abc import Iterator

from workers.rl.models.packaged import SMOLLM2_135M
from workers.rl.rollout.tools import RUN_PYTHON_TOOL

from .coding import Problem, instance
from .draft import Draft

SUM_LIMIT = 20  # a, b in 0..20: 441 sums
EXPRESSIONS = 300
SEED = 135

# sync: on a CPU the engine and the trainer would share the same cores (each with its own thread pool, so four
# busy threads on two cores); one after the other wastes nothing. On a GPU worker, --set mode=async.
MODEL_SLUG = SMOLLM2_135M.name.removeprefix("builtin:")
RUN_CONFIG = {
    "mode": "sync", "model": f"model/{MODEL_SLUG}", "engine": "transformers", "lora_rank": 16, "lora_alpha": 32,
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


def _ints(rng, low=-20, high=40, most=8):
    return [rng.randint(low, high) for _ in range(rng.randint(0, most))]


def _word(rng):
    return "".join(rng.choice("abcdeiouxyzAEIOU") for _ in range(rng.randint(0, 12)))


def one_liners() -> Iterator[Problem]:
    for a in range(2, 7):
        for b in range(1, 10, 2):
            yield Problem(f"scale-{a}-shift-{b}", "scale-shift", "transform", "def transform(x: int) -> int",
                          f"Write a Python function transform(x) that returns x * {a} + {b}.",
                          f"def transform(x):\n    return x * {a} + {b}\n", lambda x, a=a, b=b: x * a + b,
                          ((0,), (-3,)), lambda rng: (rng.randint(-100, 100),))
    for k in range(2, 13):
        yield Problem(f"divisible-by-{k}", "divisible", "divisible", "def divisible(n: int) -> bool",
                      f"Write a Python function divisible(n) that returns True if n is divisible by {k}, else False.",
                      f"def divisible(n):\n    return n % {k} == 0\n", lambda n, k=k: n % k == 0,
                      ((0,), (k,), (k + 1,)), lambda rng: (rng.randint(-60, 60),))
    for t in (-5, 0, 3, 7, 10, 15, 20):
        yield Problem(f"count-above-{'minus-' if t < 0 else ''}{abs(t)}", "count-above", "count_above",
                      "def count_above(xs: list[int]) -> int",
                      f"Write a Python function count_above(xs) that returns how many numbers in the list xs are "
                      f"greater than {t}.",
                      f"def count_above(xs):\n    return sum(1 for x in xs if x > {t})\n",
                      lambda xs, t=t: len([x for x in xs if x > t]), (([],), ([t, t + 1],)),
                      lambda rng: (_ints(rng),))
    for k in range(1, 6):
        yield Problem(f"last-{k}", "last-items", "last_items", "def last_items(xs: list[int]) -> list[int]",
                      f"Write a Python function last_items(xs) that returns the last {k} items of the list xs (all "
                      f"of them if it has fewer).",
                      f"def last_items(xs):\n    return xs[-{k}:]\n", lambda xs, k=k: xs[max(0, len(xs) - k):],
                      (([],), (list(range(k + 2)),)), lambda rng: (_ints(rng),))
    yield Problem("count-vowels", "vowels", "count_vowels", "def count_vowels(s: str) -> int",
                  "Write a Python function count_vowels(s) that returns how many vowels (a, e, i, o, u, upper or "
                  "lower case) the string s contains.",
                  "def count_vowels(s):\n    return sum(1 for c in s.lower() if c in 'aeiou')\n",
                  lambda s: len([c for c in s if c in "aeiouAEIOU"]), (("",), ("AEIOUx",)), lambda rng: (_word(rng),))


def python_instances() -> list[dict]:
    rng = random.Random(SEED)
    return [instance(problem, rng) for problem in one_liners()]


def drafts() -> list[Draft]:
    sums = {
        "prompt_template": "What is {a}+{b}? Answer with just the number.",
        "sandbox_image": "python-3-11",
        "verifier": "number-only",
        "limits": {"max_turns": 1, "max_tokens": 10, "max_seconds": 10},
    }
    functions = {
        "prompt_template": "{statement} For example, {example}. Reply with the code in one ```python block.",
        "sandbox_image": "python-3-11",
        "verifier": "python-unit-tests",
        "limits": {"max_turns": 1, "max_tokens": 64, "max_seconds": 60},
    }
    tool_use = {
        # The call is shown made, once, as an earlier exchange: told the format in words, SmolLM2-135M wrote no
        # parsable call in 32 samples; shown it made, 2 in 32 were parsable and 16 began one (measured with
        # `generate` at temperature 1) — something for RL to reward.
        "examples": [
            {"role": "user", "content": "What is 12 * 13 + 100? Use the run_python tool."},
            {"role": "assistant", "content": '<tool_call>\n{"name": "run_python", "arguments": '
                                             '{"code": "print(12 * 13 + 100)"}}\n</tool_call>'},
            {"role": "tool", "content": "256"},
            {"role": "assistant", "content": "256"},
        ],
        "prompt_template": "What is {expression}? Use the run_python tool.",
        "tools": [RUN_PYTHON_TOOL],
        "sandbox_image": "python-3-11",
        "verifier": "number-only",
        "limits": {"max_turns": 3, "max_tokens": 48, "max_seconds": 60},
    }
    return [
        Draft("model", MODEL_SLUG, SMOLLM2_135M.description,
              {"source": {"type": "package", "name": MODEL_SLUG}, "licence": SMOLLM2_135M.licence}),
        Draft("task_template", "smol-sum", "a+b for a, b up to 20, answered with just the number.", sums,
              sum_instances()),
        Draft("task_template", "smol-functions", "One-line Python functions, one fenced block, hidden unittest "
              "tests.", functions, python_instances()),
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

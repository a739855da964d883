"""The repair domain: buggy functions with their tests, for a small model to learn the loop of running the tests,
reading the failure and fixing the code (issue 44).

Every function of the demo's code tasks (coding.problems(), smollm.one_liners()) becomes a tiny repository:
`solution.py` (its canonical solution), `test_solution.py` (visible pytest cases, each assertion's message naming
the call, what it returned and what was expected) and `test_hidden.py` (more cases, which the workspace never holds:
they travel as the instance's test patch, and verification runs both). The studio's mutation search
(workers/rl/tasks/repository_mutations.py) breaks `solution.py` where a visible test catches it; `manage.py
repair_tasks` ran it once and recorded what it kept in repair_tasks/<family>.json, so seeding rebuilds the same
instances from the same functions without running anything (as repositories.py does).

The prompt shows what the function should do and its buggy source, not the test output: `run_tests` shows that
(workers/rl/rollout/swe_tools.py, REPAIR_TOOLS). Held out: every task of whole families of functions, drawn with a
fixed seed until they make a fifth of the tasks, so no function and no family of the eval suite's is trained on.
"""

from __future__ import annotations

import ast
import copy
import json
import random
from pathlib import Path

from workers.rl.rollout.swe_tools import REPAIR_TOOLS
from workers.rl.tasks.repository_mutations import instances_from_record
from workers.verifiers.repository import snapshot_contents

from . import coding, smollm
from .coding import Problem
from .draft import Draft

RECORDS = Path(__file__).parent / "repair_tasks"
SOURCES = {"coding": coding.problems, "smollm": smollm.one_liners}
SOLUTION, VISIBLE, HIDDEN = "solution.py", "test_solution.py", "test_hidden.py"
VISIBLE_CASES = 3  # drawn cases beside the family's edge cases: few, so run_tests' output stays short
HIDDEN_CASES = 8
HELD_OUT_SHARE = 0.2
SEED = 44
SUFFIX = "-held-out"
TEMPLATE, DOMAIN, BUNDLE, SUITE = "function-repair", "python-repair", "demo-repair-smollm", "repair-suite"

SYSTEM_PROMPT = ("You fix a bug in solution.py. Call run_tests to see which tests fail, str_replace_editor to view "
                 "and edit the file, run_tests again, then submit. Fix the code, not the tests.")
PROMPT = "{statement}\n\nThis function in {path} has a bug:\n\n```python\n{function}\n```"


# The same function twice: smollm's count_vowels is coding's count-vowels (count_in_set over the same vowels).
DUPLICATES = {("smollm", "count-vowels")}


def problems() -> dict[str, tuple[str, Problem]]:
    """Every source function by its key: (source, problem)."""
    found = {}
    for source, listed in SOURCES.items():
        for problem in listed():
            if (source, problem.key) in DUPLICATES:
                continue
            if problem.key in found:
                raise ValueError(f"two problems are keyed {problem.key}; the repair records are keyed by it")
            found[problem.key] = (source, problem)
    return found


def _cases(problem: Problem) -> tuple[list[tuple], list[tuple]]:
    """(visible, hidden) cases as (arguments, expected): the edge cases and a few draws visible, further draws
    hidden; seeded by the problem's key, so a rebuild makes the same files."""
    rng = random.Random(f"{SEED}-{problem.key}")
    arguments = list(problem.edge_cases)
    wanted = len(arguments) + VISIBLE_CASES + HIDDEN_CASES
    for _ in range(wanted * 4):  # draws may repeat
        if len(arguments) >= wanted:
            break
        drawn = problem.draw(rng)
        if drawn not in arguments:
            arguments.append(drawn)
    cases = [(args, problem.reference(*copy.deepcopy(args))) for args in arguments]
    split = len(problem.edge_cases) + VISIBLE_CASES
    return cases[:split], cases[split:]


def _tests_source(problem: Problem, cases: list[tuple], name: str) -> str:
    rows = "".join(f"    pytest.param({args!r}, {expected!r}, id=\"case{n}\"),\n"
                   for n, (args, expected) in enumerate(cases, start=1))
    entry = problem.entry_point
    return (f"import copy\n\nimport pytest\n\nfrom solution import {entry}\n\nCASES = [\n{rows}]\n\n\n"
            f"@pytest.mark.parametrize(\"args, expected\", CASES)\n"
            f"def {name}(args, expected):\n"
            f"    returned = {entry}(*copy.deepcopy(args))\n"
            f"    call = \"{entry}(\" + \", \".join(map(repr, args)) + \")\"\n"
            f"    assert returned == expected, f\"{{call}} returned {{returned!r}}, expected {{expected!r}}\"\n")


def repository_files(problem: Problem) -> dict[str, bytes]:
    visible, hidden = _cases(problem)
    return {SOLUTION: problem.solution.encode(),
            VISIBLE: _tests_source(problem, visible, f"test_{problem.entry_point}").encode(),
            HIDDEN: _tests_source(problem, hidden, f"test_{problem.entry_point}_more").encode()}


def is_visible_test(test_id: str) -> bool:
    return test_id.startswith(f"{VISIBLE}::")


def enclosing_function(source: str, line: int) -> str:
    """The source of the function whose body holds `line` (the whole file when none does)."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.lineno <= line <= node.end_lineno:
            return ast.get_source_segment(source, node)
    return source


def repair_instance(problem: Problem, instance: dict) -> dict:
    """A mutation's repository instance (mutation_instance) with the repair prompt's inputs: what the function
    should do and its buggy source, not the tests' output."""
    broken = snapshot_contents(instance["inputs"]["repository"])[SOLUTION].decode()
    return {"key": instance["key"],
            "inputs": {"statement": problem.statement, "path": SOLUTION, "family": problem.family,
                       "function": enclosing_function(broken, instance["hidden"]["mutation"]["line"]),
                       "repository": instance["inputs"]["repository"]},
            "hidden": {**instance["hidden"], "entry_point": problem.entry_point}}


def records() -> list[dict]:
    return [json.loads(path.read_text()) for path in sorted(RECORDS.glob("*.json"))]


def instances() -> list[dict]:
    """Every recorded task, rebuilt: ValueError when a record no longer matches its function (a solution or its
    cases changed since `manage.py repair_tasks` ran: run it again for that family)."""
    by_key, found = problems(), []
    for family in records():
        for record in family["repositories"]:
            _, problem = by_key[record["package"]]
            found += [repair_instance(problem, instance)
                      for instance in instances_from_record(repository_files(problem), record)]
    return found


def held_out_families(tasks: list[dict], *, share: float = HELD_OUT_SHARE, seed: int = SEED) -> set[str]:
    """Whole families, in a seeded order, until their tasks make `share` of all."""
    counts: dict[str, int] = {}
    for task in tasks:
        counts[task["inputs"]["family"]] = counts.get(task["inputs"]["family"], 0) + 1
    order = sorted(counts)
    random.Random(seed).shuffle(order)
    held: set[str] = set()
    for family in order:
        if sum(counts[f] for f in held) >= share * len(tasks):
            break
        held.add(family)
    return held


def split(tasks: list[dict]) -> tuple[list[dict], list[dict]]:
    """(training, held out)."""
    held = held_out_families(tasks)
    return ([t for t in tasks if t["inputs"]["family"] not in held],
            [t for t in tasks if t["inputs"]["family"] in held])


# SmolLM2's context holds the whole trajectory: the system prompt with the tools' schemas (~400 tokens), the prompt
# (~150), five short calls and their results (run_tests' report is a few lines): 1,536 tokens.
CONTEXT_TOKENS = 1536
# A malformed call is answered with its error twice (SWE-agent's budget of format errors is three); the turns and
# tokens leave room for them beside the five of the expert's loop.
LIMITS = {"max_turns": 10, "max_tokens": 800, "max_seconds": 300, "max_tool_calls": 8, "max_turn_tokens": 160,
          "max_tool_errors": 2}


def drafts() -> list[Draft]:
    """The repair template and its held-out twin, their domains, SmolLM2's bundle and the eval suite. The sandbox
    image and verifier are the repository tasks' (repositories.py), published beside them."""
    template = {
        "system_prompt": SYSTEM_PROMPT,
        "prompt_template": PROMPT,
        "tools": list(REPAIR_TOOLS),
        "sandbox_image": "python-pytest",
        "verifier": "repository-tests",
        "limits": LIMITS,
        "session": {"idle_timeout": 120, "lifetime": 600, "max_calls": 40, "disk_mb": 64, "memory_mb": 512,
                    "call_seconds": 60},
    }
    training, held = split(instances())
    families = sorted({t["inputs"]["family"] for t in held})
    return [
        Draft("task_template", TEMPLATE, "Fix a bug planted in a small function: run the tests, read the failure, "
              "edit, run them again, submit; hidden tests decide.", template, training),
        Draft("task_template", TEMPLATE + SUFFIX, f"Held out from {TEMPLATE}: every task of the function families "
              f"{', '.join(families)}, which no training task touches.", template, held),
        Draft("domain", DOMAIN, "Buggy functions of the demo's code tasks with their tests, made by mutation.",
              {"sampling_weight": 1.0, "templates": [{"template": TEMPLATE, "weight": 1.0}]}),
        Draft("domain", DOMAIN + SUFFIX, "The repair domain's held-out function families: the eval suite's.",
              {"sampling_weight": 1.0, "templates": [{"template": TEMPLATE + SUFFIX, "weight": 1.0}]}),
        Draft("bundle", BUNDLE, "The repair loop for SmolLM2-135M-Instruct (LoRA GRPO on the CPU): run the tests, "
              "fix, run them again, submit.",
              {"members": [f"domain/{DOMAIN}@latest"],
               # Two groups a step, not the smollm demo's four: a repair group's rollouts and their training cost
               # minutes on two cores (five turns of ~1,100 tokens each), so half the groups give twice the
               # updates in the same time; the run's own evaluation takes 8 training tasks (the held-out score is
               # the eval suite's).
               "run_config": {**smollm.RUN_CONFIG, "context_length": CONTEXT_TOKENS, "eval_suite": SUITE,
                              "groups_per_step": 2, "eval_tasks_per_domain": 8}}),
        Draft("bundle", SUITE, "The repair eval suite: held-out function families, and a sample of the demo's "
              "repository tasks (before/after on real packages), greedy.",
              {"members": [f"domain/{DOMAIN}{SUFFIX}@latest", "domain/python-repositories@latest"],
               "evaluation": {"tasks_per_template": 24, "seed": 7},
               # Every model answers it in the trained model's context: the base model in its own 8,192 tokens
               # wrote on for minutes a repository task (8 of them had not finished in 11 minutes on 2 cores).
               "run_config": {"model": smollm.RUN_CONFIG["model"], "engine": smollm.RUN_CONFIG["engine"],
                              "context_length": CONTEXT_TOKENS}}),
    ]

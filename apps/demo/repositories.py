"""Repository tasks from real code: bug-fix instances of two small pure-Python packages from the package index.

`make setup` downloads their sdists (source and tests) into .venv/repositories; the mutations that make their
tests fail were found once by `manage.py tasks from-repo` and are recorded in repository_tasks/*.json, so seeding
rebuilds the same instances from the same sdists without running anything (each record names its sdist; a
different one is refused). The demo's reference check then replays every gold patch through the real sandbox.

The packages and their licences (each task also carries its licence in `hidden.licence`):
- inflection 0.5.1 (MIT, Janne Vanhala): Rails' inflector; test_inflection.py, 455 pytest cases.
- roman 5.2 (ZPL-2.1, Mark Pilgrim and the Zope Foundation): integer to Roman numerals; src/tests.py, unittest.
"""

import json
import sys
from pathlib import Path

from workers.rl.rollout.swe_tools import SWE_TOOLS
from workers.rl.tasks.repository_mutations import instances_from_record
from workers.verifiers.repository import PYTEST_PIN, archive_files

from .draft import Draft

RECORDS = Path(__file__).parent / "repository_tasks"
SOURCES = Path(sys.prefix) / "repositories"  # where `make setup` downloads the sdists
PACKAGES = {"inflection": ("inflection==0.5.1", "MIT"), "roman": ("roman==5.2", "ZPL-2.1")}

SYSTEM_PROMPT = ("You fix bugs in a Python repository. The repository is your working directory. Use the tools: "
                 "bash to run commands (a new shell each call), str_replace_editor to view and edit files, and "
                 "submit when the tests pass. Fix the library's code, not its tests.")
PROMPT = "{problem_statement}"


def sources_missing() -> list[str]:
    return [record["source"] for record in records() if not (SOURCES / record["source"]).is_file()]


def records() -> list[dict]:
    return [json.loads(path.read_text()) for path in sorted(RECORDS.glob("*.json"))]


def instances() -> list[dict]:
    found = []
    for record in records():
        source = SOURCES / record["source"]
        if not source.is_file():
            raise FileNotFoundError(f"{source} is missing: `make setup` downloads it (pip download --no-deps "
                                    f"--no-binary :all: {PACKAGES[record['package']][0]})")
        found += instances_from_record(archive_files(source), record)
    return found


IMAGE = {
    # git applies the model's diff at verification (harness/repository_runner.py).
    "layers": [{"type": "base", "image": "python-3.11-slim"}, {"type": "system_packages", "packages": ["git"]},
               {"type": "python_packages", "packages": [PYTEST_PIN]}],
    "limits": {"cpus": 1, "cpu_seconds": 120, "memory_mb": 1024, "wall_seconds": 180, "max_processes": 64,
               "disk_mb": 256, "network": False},
    "warm_pool_size": 2,
}

VERIFIER = {"layers": [{"name": "repository-tests", "kind": "environment", "checks": [
    {"type": "repository_tests", "name": "hidden-tests", "timeout_seconds": 120}]}]}


def drafts() -> list[Draft]:
    template = {
        "system_prompt": SYSTEM_PROMPT,
        "prompt_template": PROMPT,
        "tools": list(SWE_TOOLS),
        "sandbox_image": "python-pytest",
        "verifier": "repository-tests",
        "limits": {"max_turns": 40, "max_tokens": 16384, "max_seconds": 600, "max_tool_calls": 40},
        "session": {"idle_timeout": 300, "lifetime": 900, "max_calls": 200, "disk_mb": 256, "memory_mb": 1024,
                    "call_seconds": 120},
    }
    licences = ", ".join(f"{name} ({licence})" for name, (_, licence) in PACKAGES.items())
    return [
        Draft("sandbox_image", "python-pytest", "Python 3.11 with pytest, for repository tasks; no network.", IMAGE),
        Draft("verifier", "repository-tests", "The workspace's diff replayed on the base in a fresh sandbox, test "
              "files as the base has them; every FAIL_TO_PASS and PASS_TO_PASS test must pass.", VERIFIER),
        Draft("task_template", "repository-bugfix", "Fix a bug in a real package, found by its own tests; a session "
              "holds the repository for the whole trajectory.", template, instances()),
        Draft("domain", "python-repositories", f"Bug-fix tasks in real pure-Python packages from the package index "
              f"(licences: {licences}), made by mutating their source where their tests catch it.",
              {"sampling_weight": 1.0, "templates": [{"template": "repository-bugfix", "weight": 1.0}]}),
        Draft("bundle", "demo-repositories", "The repository domain alone: long trajectories in one sandbox session.",
              {"members": ["domain/python-repositories@latest"], "run_config": {"model": "model/demo-tiny"}}),
    ]

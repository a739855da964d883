"""Repository tasks from SWE-bench's instance format, validated before they are published.

`read_swe_bench(file, repos)` reads a JSONL file of SWE-bench instances (`instance_id`, `problem_statement`,
`patch`, `test_patch`, `FAIL_TO_PASS`, `PASS_TO_PASS`, and `repo`, `base_commit`, `version` when present) whose
repositories are local: `repos/<instance_id>/` or `repos/<instance_id>.tar.gz`, at the base commit. Nothing is
cloned, and no version control comes along (workers/verifiers/repository.py leaves .git out of the snapshot).

`validate_repository_tasks(...)` checks each instance through the real sandbox, as SWE-bench validates its own:
the gold patch must score 1 and no patch 0 (workers.verifiers.repository.validate_instance); an instance that
fails is refused with its reason.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from workers.verifiers.repository import Validation, swe_bench_instance, validate_instance

from .errors import FieldError, SpecError

SWE_BENCH = "swe-bench"
DEFAULT_TIMEOUT = 120.0


def read_swe_bench(path: Path, repos: Path) -> list[dict]:
    """The file's instances, or SpecError naming every bad line."""
    if not repos.is_dir():
        raise SpecError([FieldError("repos", f"{repos} is not a directory (it holds <instance_id>/ or "
                                             "<instance_id>.tar.gz for each instance)")])
    instances, errors, seen = [], [], {}
    with open(path, encoding="utf-8-sig") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                if not isinstance(row, dict):
                    raise ValueError("must be a JSON object")
                instance = swe_bench_instance(row, repos)
            except ValueError as exc:
                errors.append(FieldError(f"line {number}", str(exc)))
                continue
            if instance["key"] in seen:
                errors.append(FieldError(f"line {number}",
                                         f"{instance['key']!r} is also on line {seen[instance['key']]}"))
                continue
            seen[instance["key"]] = number
            instances.append(instance)
    if errors:
        raise SpecError(errors)
    if not instances:
        raise SpecError([FieldError(path.name, "holds no instances")])
    return instances


def verifier_timeout(verifier_spec: dict) -> float:
    """The repository_tests check's timeout in the template's verifier (the default when it has none)."""
    for layer in verifier_spec.get("layers", []):
        for check in layer.get("checks", []):
            if check.get("type") == "repository_tests":
                return float(check.get("timeout_seconds", DEFAULT_TIMEOUT))
    return DEFAULT_TIMEOUT


def validate_repository_tasks(instances: list[dict], *, pool, image, timeout: float, concurrency: int = 2,
                              progress: Callable[[Validation], None] | None = None) -> list[Validation]:
    """Each instance's Validation, in the file's order, `concurrency` at a time over the sandbox pool."""

    def check(instance: dict) -> Validation:
        validation = validate_instance(pool, image, instance, timeout=timeout)
        if progress is not None:
            progress(validation)
        return validation

    with ThreadPoolExecutor(max_workers=max(1, concurrency), thread_name_prefix="validate") as threads:
        return list(threads.map(check, instances))

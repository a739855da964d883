"""Repository tasks from SWE-bench's instance format, validated before they are published.

`read_swe_bench(file, repos)` reads a JSONL file of SWE-bench instances (`instance_id`, `problem_statement`,
`patch`, `test_patch`, `FAIL_TO_PASS`, `PASS_TO_PASS`, and `repo`, `base_commit`, `version` when present) whose
repositories are local: `repos/<instance_id>/` or `repos/<instance_id>.tar.gz`, at the base commit. Nothing is
cloned, and no version control comes along (workers/verifiers/repository.py leaves .git out of the snapshot).

`validate_repository_tasks(...)` checks each instance through the real sandbox, as SWE-bench validates its own:
the gold patch must score 1 and no patch 0 (workers.verifiers.repository.validate_instance); an instance that
fails is refused with its reason, and one that passes says what verification left out of its gold patch, if
anything (a test file's section, a binary change, text that is no file's diff). `manage.py import_tasks --format
swe-bench` and the upload page (`read_swe_bench_upload`: one archive of instances.jsonl and repos/) both go
through these.
"""

from __future__ import annotations

import json
import tarfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from apps.common import wiring
from apps.registry.errors import FieldError, SpecError
from workers.verifiers.repository import (
    SnapshotError,
    Validation,
    bounded_members,
    swe_bench_instance,
    validate_instance,
)

from .task_files import TaskFile

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


# --- the upload page: one archive holding instances.jsonl and repos/ -----------------------------------------

UPLOAD_INPUTS = {"problem_statement", "repository"}  # what a swe-bench row gives the prompt template


def read_swe_bench_upload(archive: Path, folder: Path, *, image, timeout: float,
                          progress: Callable[[int, int, int], None] | None = None) -> TaskFile:
    """What the upload page reads from a swe-bench upload: a .tar.gz holding `instances.jsonl` and `repos/`
    (each repository as `repos/<instance_id>/` or `repos/<instance_id>.tar.gz`), unpacked into `folder`, each
    instance validated through the sandbox. The valid instances are the file's tasks, each placed by its instance id
    (with what verification left out of its gold patch, if anything); every refused one is a bad row named by its
    instance id with its reason, so the page's "the good rows only" publishes the rest."""
    found = TaskFile(file_type="swe-bench archive")
    try:
        with tarfile.open(archive, "r:*") as tar:
            # no absolute paths, links out or devices; sizes bounded before anything is written
            tar.extractall(folder, members=bounded_members(tar), filter="data")
    except (OSError, tarfile.TarError, SnapshotError) as exc:
        found.read_whole = False
        found.fail(archive.name, f"is not a .tar.gz of instances.jsonl and repos/: {exc}")
        return found
    instances_file = next(iter(sorted(folder.rglob("instances.jsonl"), key=lambda p: len(p.parts))), None)
    if instances_file is None:
        found.fail(archive.name, "holds no instances.jsonl")
        return found
    try:
        instances = read_swe_bench(instances_file, instances_file.parent / "repos")
    except SpecError as exc:
        for error in exc.errors:
            found.fail(error.field, error.problem)
        return found
    found.rows = len(instances)
    done = []

    def counted(validation: Validation) -> None:
        done.append(validation)
        if progress is not None:
            progress(len(done), len(done), len(instances))

    pool = wiring.sandbox_pool()
    try:
        validations = validate_repository_tasks(instances, pool=pool, image=image, timeout=timeout, progress=counted)
    finally:
        pool.close()
    for instance, validation in zip(instances, validations, strict=True):
        if validation.ok:
            found.instances.append(instance)
            found.places.append(f"{instance['key']}: {validation.report}" if validation.left_out else instance["key"])
        else:
            found.fail(instance["key"], f"{validation.reason}: {validation.detail[:500]}")
    return found

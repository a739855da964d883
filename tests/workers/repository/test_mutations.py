"""Bug-fix tasks from real code (SWE-smith's way): ast mutations of a repository's source, each a one-span edit
whose reverse diff applies with git; the search keeps only mutations its tests catch, and `manage.py tasks
from-repo` writes them in SWE-bench's format, rebuilt identically from its record."""

import json
import subprocess

import pytest
from django.core.management import call_command

from workers.rl.tasks.repository_mutations import (
    OPERATORS,
    file_diff,
    instances_from_record,
    mutated_files,
    mutation_candidates,
)
from workers.verifiers.repository import snapshot_contents

CORE = '''def clamp(x, low, high):
    if x < low:
        return low
    if x > high:
        return high
    return x


def sign(x):
    if x >= 0:
        return 1
    else:
        return -1


def windows(values, size):
    return [values[i:i + size] for i in range(0, len(values) - size + 1)]


def both(a, b):
    return a and b
'''
TESTS = '''from shapes.core import both, clamp, sign, windows


def test_clamp_low():
    assert clamp(-5, 0, 10) == 0


def test_clamp_high():
    assert clamp(50, 0, 10) == 10


def test_clamp_inside():
    assert clamp(5, 0, 10) == 5


def test_sign():
    assert (sign(3), sign(-2)) == (1, -1)


def test_windows():
    assert windows([1, 2, 3], 2) == [[1, 2], [2, 3]]


def test_both():
    assert both(True, False) is False
'''
FILES = {"shapes/__init__.py": b"", "shapes/core.py": CORE.encode(), "tests/test_core.py": TESTS.encode()}


def test_every_operator_finds_its_places_and_each_reverse_diff_applies(tmp_path):
    candidates = mutation_candidates(FILES)
    assert {m.operator for m in candidates} == set(OPERATORS)
    assert all(m.path == "shapes/core.py" for m in candidates)  # never the tests
    (tmp_path / "shapes").mkdir()
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    for mutation in candidates:
        broken = mutated_files(FILES, mutation)["shapes/core.py"].decode()
        changed = [n for n, (a, b) in enumerate(zip(CORE.splitlines(), broken.splitlines(), strict=False)) if a != b]
        assert broken != CORE and mutation.line - 1 <= changed[0] <= mutation.end_line - 1, mutation
        (tmp_path / "shapes/core.py").write_text(broken)
        subprocess.run(["git", "apply", "-"], cwd=tmp_path, check=True,
                       input=file_diff("shapes/core.py", broken, CORE).encode())
        assert (tmp_path / "shapes/core.py").read_text() == CORE, mutation
    flips = {m.new for m in candidates if m.operator == "flip_comparison"}
    assert {"x >= low", "x <= high", "x < 0"} <= flips


@pytest.mark.sandbox
def test_from_repo_keeps_what_the_tests_catch_and_writes_swe_bench(tmp_path, capsys):
    for name, content in FILES.items():
        (tmp_path / "shapes-1.0" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "shapes-1.0" / name).write_bytes(content)
    out = tmp_path / "out"
    call_command("tasks", "from-repo", str(tmp_path / "shapes-1.0"), "--out", str(out), "--count", "1",
                 "--max-tries", "4", "--licence", "MIT", "--timeout", "30")
    rows = [json.loads(line) for line in (out / "instances.jsonl").read_text().splitlines()]
    record = json.loads((out / "mutations.json").read_text())
    assert len(rows) == len(record["mutations"]) >= 1 and record["package"] == "shapes" and record["licence"] == "MIT"
    assert sorted(record["tests"]) == sorted(f"tests/test_core.py::{name}" for name in (
        "test_clamp_low", "test_clamp_high", "test_clamp_inside", "test_sign", "test_windows", "test_both"))
    rebuilt = instances_from_record(FILES, record)
    for row, instance in zip(rows, rebuilt, strict=True):
        assert row["instance_id"] == instance["key"] and row["patch"] == instance["hidden"]["patch"]
        assert row["FAIL_TO_PASS"] and set(row["FAIL_TO_PASS"]).isdisjoint(row["PASS_TO_PASS"])
        assert set(row["FAIL_TO_PASS"]) | set(row["PASS_TO_PASS"]) == set(record["tests"])
        assert "Fix the library's code" in row["problem_statement"] and "FAILED" in row["problem_statement"]
        files = snapshot_contents(instance["inputs"]["repository"])
        assert files["tests/test_core.py"] == FILES["tests/test_core.py"] and files["shapes/core.py"] != FILES[
            "shapes/core.py"]
        assert (out / "repos" / f"{row['instance_id']}.tar.gz").is_file()

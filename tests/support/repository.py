"""A small repository task for the tests: a package with an off-by-one, its tests, the fix and a hidden test.

`calc/ranges.py`'s `inclusive_range(a, b)` leaves out `b`; tests/test_ranges.py checks two other functions
(PASS_TO_PASS) and the hidden test patch adds the test that fails on the bug (FAIL_TO_PASS).
"""

from __future__ import annotations

from workers.sandbox import Limits, SandboxImage
from workers.verifiers.repository import PYTEST_PIN, snapshot_files

RANGES = '''def inclusive_range(a, b):
    """The integers from a to b, both included."""
    return list(range(a, b))


def total(values):
    return sum(values)


def largest(values):
    return max(values)
'''

FIXED = RANGES.replace("list(range(a, b))", "list(range(a, b + 1))")

VISIBLE_TESTS = '''from calc.ranges import largest, total


def test_total():
    assert total([1, 2, 3]) == 6


def test_largest():
    assert largest([3, 9, 2]) == 9
'''

FILES = {"calc/__init__.py": b"", "calc/ranges.py": RANGES.encode(), "tests/__init__.py": b"",
         "tests/test_ranges.py": VISIBLE_TESTS.encode(), "README.md": b"# calc\n"}

# As git writes it; the context lines of the blank lines are a single space.
GOLD_PATCH = ("diff --git a/calc/ranges.py b/calc/ranges.py\n--- a/calc/ranges.py\n+++ b/calc/ranges.py\n"
              "@@ -1,6 +1,6 @@\n def inclusive_range(a, b):\n"
              "     \"\"\"The integers from a to b, both included.\"\"\"\n"
              "-    return list(range(a, b))\n+    return list(range(a, b + 1))\n \n \n def total(values):\n")

# The same fix as `diff -ru a b` writes it between the repository and its fixed copy: no `diff --git` line, each
# name with its timestamp after a tab, and diff's own lines between files.
PLAIN_GOLD_PATCH = ("Only in b/calc: __pycache__\ndiff -ru a/calc/ranges.py b/calc/ranges.py\n"
                    "--- a/calc/ranges.py\t2024-05-02 10:00:00.000000000 +0000\n"
                    "+++ b/calc/ranges.py\t2024-05-02 10:05:00.000000000 +0000\n" + GOLD_PATCH.split("\n", 3)[3])

# The same fix as `diff -c` writes it: a context diff, which git apply does not read.
CONTEXT_GOLD_PATCH = """*** calc/ranges.py.orig\t2024-05-02 10:00:00.000000000 +0000
--- calc/ranges.py\t2024-05-02 10:05:00.000000000 +0000
***************
*** 1,3 ****
  def inclusive_range(a, b):
      \"\"\"The integers from a to b, both included.\"\"\"
!     return list(range(a, b))
--- 1,3 ----
  def inclusive_range(a, b):
      \"\"\"The integers from a to b, both included.\"\"\"
!     return list(range(a, b + 1))
"""

TEST_PATCH = """diff --git a/tests/test_hidden.py b/tests/test_hidden.py
new file mode 100644
--- /dev/null
+++ b/tests/test_hidden.py
@@ -0,0 +1,5 @@
+from calc.ranges import inclusive_range
+
+
+def test_inclusive_range():
+    assert inclusive_range(1, 3) == [1, 2, 3]
"""

FAIL_TO_PASS = ["tests/test_hidden.py::test_inclusive_range"]
PASS_TO_PASS = ["tests/test_ranges.py::test_total", "tests/test_ranges.py::test_largest"]

REPOSITORY_IMAGE = SandboxImage(
    key="test/repository@1",
    layers=({"type": "base", "image": "python-3.11"}, {"type": "python_packages", "packages": [PYTEST_PIN]}),
    limits=Limits(cpu_seconds=30, wall_seconds=60, memory_mb=512, max_processes=64, disk_mb=64),
    warm_pool_size=2)


def repository_instance(key: str = "calc-1") -> dict:
    """The task instance as import and publishing hold it: {key, inputs, hidden}."""
    return {"key": key,
            "inputs": {"problem_statement": "inclusive_range(a, b) leaves out b.",
                       "repository": snapshot_files(FILES)},
            "hidden": {"patch": GOLD_PATCH, "test_patch": TEST_PATCH, "FAIL_TO_PASS": FAIL_TO_PASS,
                       "PASS_TO_PASS": PASS_TO_PASS}}


def diff_of(changes: dict[str, str | None], files: dict[str, bytes] = FILES) -> str:
    """The git diff a workspace holding `files` shows after `changes` (path -> new text, or None to delete it), made
    by git on this machine as the sandbox session makes it."""
    import subprocess
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        for name, content in files.items():
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            (root / name).write_bytes(content)
        git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", folder]
        subprocess.run([*git, "init", "-q"], check=True)
        subprocess.run([*git, "add", "-A"], check=True)
        subprocess.run([*git, "commit", "-q", "-m", "base"], check=True)
        for name, content in changes.items():
            if content is None:
                (root / name).unlink()
            else:
                (root / name).parent.mkdir(parents=True, exist_ok=True)
                (root / name).write_text(content)
        subprocess.run([*git, "add", "-A"], check=True)
        return subprocess.run([*git, "diff", "--cached", "--binary", "HEAD"], check=True, capture_output=True,
                              text=True).stdout

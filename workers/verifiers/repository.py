"""Repository tasks: a repository snapshot and a problem statement, verified by replaying the model's diff.

A task instance holds the repository at its base as a snapshot (`inputs["repository"]`: a deterministic
tar.gz, base64, with its sha256) and, hidden, the tests that decide it: `test_patch` (tests the workspace never
saw), `FAIL_TO_PASS` and `PASS_TO_PASS` (pytest node ids) and the gold `patch`. SWE-bench's instance format,
with the repository carried along instead of cloned.

The `repository_tests` check takes the workspace's diff against the base (`sample.files["workspace.diff"]`) and
runs, in a fresh sandbox (harness/repository_runner.py): the base snapshot + the diff with every test file and
every file that steers pytest or the interpreter taken out (test_patch's files, tests/ and test_*.py,
conftest.py, pytest.ini, tox.ini, setup.cfg, pyproject.toml, sitecustomize.py, *.pth) + the hidden test patch,
then pytest on the tests' files. Reward 1 only if every FAIL_TO_PASS and PASS_TO_PASS test reports an explicit
pass; an error, a skip, an expected failure or a test that never reported (a syntax error, an exit during
collection) is a failure. A diff that does not apply scores 0. What the sandbox could not do (no snapshot, the
test patch does not apply) is the task's fault, never the model's: infra_error, not a reward.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import io
import json
import re
import secrets
import tarfile
from dataclasses import dataclass, field, replace
from pathlib import Path, PurePosixPath

from workers.definitions.specs import RepositoryTests
from workers.sandbox import Execution, Status

from .types import INFRA_ERROR, Outcome

HARNESS = Path(__file__).parent / "harness"
RUNNER = (HARNESS / "repository_runner.py").read_text()
PYTEST_PLUGIN = (HARNESS / "pytest_report.py").read_text()
DIFF_FILE = "workspace.diff"  # where a sample carries its workspace's diff
# Never part of a snapshot: version control (which could hold the fix), caches and build output.
SKIPPED_NAMES = {".git", ".hg", ".svn", "__pycache__", ".pytest_cache", ".mypy_cache", ".tox", ".nox", ".eggs",
                 ".venv", "node_modules"}
SKIPPED_SUFFIXES = (".pyc", ".pyo")
MAX_SNAPSHOT_BYTES = 20 * 1024 * 1024  # compressed; larger repositories belong in a sandbox image's layer
# An uploaded archive unpacked: its members' declared sizes and their count, read from the headers before any
# file is written or read (a .tar.gz of zeros grows a thousandfold).
MAX_UNPACKED_BYTES = 1024 * 1024 * 1024
MAX_UNPACKED_MEMBERS = 200_000
# Files whose changes never reach verification, wherever they are: they decide which tests run and how, or run
# code before any test does.
STEERING_FILES = {"conftest.py", "pytest.ini", "tox.ini", "setup.cfg", "pyproject.toml", "sitecustomize.py",
                  "usercustomize.py", "noxfile.py", ".pytest.ini"}
PYTEST_PIN = "pytest==9.2.0"  # the test runner repository tasks are verified with (a python_packages layer)
REASONS = ("pass", "test_failed", "patch_apply_failed", "setup_failed", "sandbox_error", "timeout")


class SnapshotError(ValueError):
    """A directory or archive that cannot become a repository snapshot; the message says why."""


# --- snapshots ---------------------------------------------------------------------------------------------

def _skipped(relative: PurePosixPath) -> bool:
    return any(part in SKIPPED_NAMES or part.endswith(".egg-info") for part in relative.parts) \
        or relative.name.endswith(SKIPPED_SUFFIXES)


def snapshot_files(files: dict[str, bytes]) -> dict:
    """A snapshot of the given files (relative path -> content): a deterministic tar.gz (sorted, no owners, no
    times), so the same files always make the same snapshot and the same task hash."""
    buffer = io.BytesIO()
    with gzip.GzipFile(fileobj=buffer, mode="wb", mtime=0, compresslevel=9) as compressed:
        with tarfile.open(fileobj=compressed, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for name in sorted(files):
                relative = PurePosixPath(name)
                if relative.is_absolute() or ".." in relative.parts:
                    raise SnapshotError(f"{name!r} leaves the repository")
                if _skipped(relative):
                    continue
                info = tarfile.TarInfo(str(relative))
                info.size, info.mode, info.mtime = len(files[name]), 0o644, 0
                tar.addfile(info, io.BytesIO(files[name]))
    data = buffer.getvalue()
    if len(data) > MAX_SNAPSHOT_BYTES:
        raise SnapshotError(f"the snapshot is {len(data) / 1e6:.1f} MB compressed; the limit is "
                            f"{MAX_SNAPSHOT_BYTES / 1e6:.0f} MB")
    return {"format": "tar.gz", "sha256": hashlib.sha256(data).hexdigest(), "files": len(files),
            "data": base64.b64encode(data).decode()}


def directory_files(root: Path) -> dict[str, bytes]:
    """The regular files under `root` a snapshot keeps (no version control, no caches; symlinks left out)."""
    if not root.is_dir():
        raise SnapshotError(f"{root} is not a directory")
    files = {}
    for path in sorted(root.rglob("*")):
        relative = PurePosixPath(path.relative_to(root).as_posix())
        if _skipped(relative) or path.is_symlink() or not path.is_file():
            continue
        files[str(relative)] = path.read_bytes()
    if not files:
        raise SnapshotError(f"{root} holds no files")
    return files


def bounded_members(tar: tarfile.TarFile) -> list[tarfile.TarInfo]:
    """The archive's members, or SnapshotError once their sizes add up past MAX_UNPACKED_BYTES or they number
    more than MAX_UNPACKED_MEMBERS (headers only: nothing is unpacked yet)."""
    members, total = [], 0
    for member in tar:
        members.append(member)
        total += member.size
        if total > MAX_UNPACKED_BYTES or len(members) > MAX_UNPACKED_MEMBERS:
            raise SnapshotError(f"unpacked it holds more than {MAX_UNPACKED_BYTES / 1e6:.0f} MB or "
                                f"{MAX_UNPACKED_MEMBERS} files; the limit is that")
    return members


def _member_path(name: str) -> str:
    """A member's path without its leading "./" and "/" (a dotfile keeps its dot: .coveragerc, .pytest.ini)."""
    while name.startswith("./"):
        name = name[2:]
    return name.lstrip("/")


def archive_files(archive: Path) -> dict[str, bytes]:
    """The regular files of a .tar.gz repository; a single top-level folder (as `git archive --prefix` and sdists
    make) is taken off."""
    try:
        with tarfile.open(archive, "r:*") as tar:
            members = [m for m in bounded_members(tar) if m.isfile()]
            files = {_member_path(m.name): tar.extractfile(m).read() for m in members}
    except (OSError, tarfile.TarError) as exc:
        raise SnapshotError(f"{archive.name} is not a readable tar archive: {exc}") from None
    except SnapshotError as exc:
        raise SnapshotError(f"{archive.name}: {exc}") from None
    tops = {name.split("/")[0] for name in files}
    if len(tops) == 1 and all("/" in name for name in files):
        files = {name.split("/", 1)[1]: content for name, content in files.items()}
    if not files:
        raise SnapshotError(f"{archive.name} holds no files")
    return files


def snapshot_bytes(snapshot: dict) -> bytes:
    data = base64.b64decode(snapshot["data"])
    if hashlib.sha256(data).hexdigest() != snapshot["sha256"]:
        raise SnapshotError("the repository snapshot does not match its sha256")
    return data


def snapshot_contents(snapshot: dict) -> dict[str, bytes]:
    """The files of a snapshot (on the trusted side: tests, the mutation search)."""
    with tarfile.open(fileobj=io.BytesIO(snapshot_bytes(snapshot)), mode="r:gz") as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}


# --- diffs -------------------------------------------------------------------------------------------------

_DIFF_HEADER = re.compile(r"^diff --git a/(\S+) b/(\S+)$", re.MULTILINE)


def diff_sections(diff: str) -> list[tuple[set[str], str]]:
    """A git diff cut into its files' sections: (the paths a section touches, its text)."""
    starts = [m.start() for m in _DIFF_HEADER.finditer(diff)]
    sections = []
    for begin, end in zip(starts, [*starts[1:], len(diff)][:len(starts)], strict=True):
        text = diff[begin:end]
        match = _DIFF_HEADER.match(text)
        sections.append(({match[1], match[2]}, text))
    return sections


def diff_paths(diff: str) -> set[str]:
    return {path for paths, _ in diff_sections(diff) for path in paths}


def is_test_path(path: str) -> bool:
    """A test file by the conventions pytest collects (tests/ or test/ folders, test_*.py, *_test.py)."""
    parts = PurePosixPath(path).parts
    name = parts[-1] if parts else ""
    return any(part in ("tests", "test", "testing") for part in parts[:-1]) or name.startswith("test_") \
        or name.endswith("_test.py") or name == "tests.py"


def is_steering_path(path: str) -> bool:
    name = PurePosixPath(path).name
    return name in STEERING_FILES or name.endswith(".pth")


_HUNK = re.compile(r"^@@ -\d+(?:,(\d+))? \+\d+(?:,(\d+))? @@")
_MODE_LINE = re.compile(r"^(new file mode|deleted file mode|old mode|new mode) \d{6}$")
_INDEX_LINE = re.compile(r"^(index [0-9a-f]+\.\.[0-9a-f]+( \d{6})?|(dis)?similarity index \d+%)$")  # git diff's own


def well_formed(paths: set[str], text: str) -> bool:
    """Whether a section is one file's plain diff: after its header only mode, index and rename lines, its own
    ---/+++ names (or a binary note), then hunks whose line counts add up. The workspace's diff writes paths as
    they are, so a path holding newlines could smuggle a second patch (--- a/conftest.py ...) into a section the
    header regex reads as another file's; git apply would apply it. Anything else is not a diff we wrote."""
    names = {"/dev/null", *(f"{side}/{path}" for path in paths for side in "ab")}
    moved = {f"{kind} {end} {path}" for path in paths for kind in ("rename", "copy") for end in ("from", "to")}
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    if len(lines) < 2:
        return False  # a header alone changes nothing; the workspace's diff never writes one
    index = 1
    while index < len(lines) and not lines[index].startswith("@@"):
        line = lines[index]
        name = line[4:] if line[:4] in ("--- ", "+++ ") else None
        binary = line.startswith("Binary files ") and line.endswith(" differ") and all(
            part in names for part in line[len("Binary files "):-len(" differ")].split(" and "))
        if not (_MODE_LINE.match(line) or _INDEX_LINE.match(line) or name in names or binary or line in moved):
            return False
        index += 1
    while index < len(lines):
        hunk = _HUNK.match(lines[index])
        if hunk is None:
            return False
        old, new = int(hunk[1] or 1), int(hunk[2] or 1)
        index += 1
        while index < len(lines) and (old > 0 or new > 0 or lines[index].startswith("\\")):
            kind = lines[index][:1]
            if kind in (" ", "") and old > 0 and new > 0:  # "": an empty context line, as git apply reads it
                old, new = old - 1, new - 1
            elif kind == "-" and old > 0:
                old -= 1
            elif kind == "+" and new > 0:
                new -= 1
            elif kind != "\\":
                return False
            index += 1
        if old or new:
            return False
    return True


def verified_diff(diff: str, protected: set[str]) -> tuple[str, list[str]]:
    """The part of the model's diff that verification applies, and the paths it left out: a section touching a
    test file, a file of `protected` (the hidden test patch's) or a file that steers pytest is dropped whole, so
    those files stay as the base has them; so is a section that is not one file's plain diff (well_formed)."""
    kept, dropped = [], []
    for paths, text in diff_sections(diff):
        if not well_formed(paths, text) or any(p in protected or is_test_path(p) or is_steering_path(p)
                                               for p in paths):
            dropped.extend(sorted(paths))
        else:
            kept.append(text)
    return "".join(kept), sorted(set(dropped))


# --- verification ------------------------------------------------------------------------------------------

@dataclass
class PatchOutcome:
    """What verifying one diff against a task found. `reason` is one of REASONS; `reward` is None when the
    task could not be verified (setup_failed, sandbox_error)."""

    reason: str
    reward: float | None
    evidence: str = ""
    results: dict[str, str] = field(default_factory=dict)
    failing: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)


def task_tests(hidden: dict) -> tuple[list[str], list[str]]:
    fail_to_pass, pass_to_pass = hidden.get("FAIL_TO_PASS") or [], hidden.get("PASS_TO_PASS") or []
    if isinstance(fail_to_pass, str):
        fail_to_pass = json.loads(fail_to_pass)
    if isinstance(pass_to_pass, str):
        pass_to_pass = json.loads(pass_to_pass)
    return list(fail_to_pass), list(pass_to_pass)


def test_files(test_ids: list[str]) -> list[str]:
    return sorted({test.split("::")[0] for test in test_ids})


@dataclass
class TestRun:
    """One run of a repository's tests in a fresh sandbox: where it ended (setup | patch | test_patch | timeout |
    tests | sandbox_error), pytest's output or the failure's, and each test's outcome."""

    stage: str
    detail: str = ""
    results: dict[str, str] = field(default_factory=dict)


def run_tests(pool, image, *, archive: bytes, diff: str, test_patch: str, test_files: list[str],
              timeout: float) -> TestRun:
    """The base `archive` (a snapshot's tar.gz) + `diff` + `test_patch`, then pytest on `test_files`, in a fresh
    sandbox of `image` (harness/repository_runner.py). The diff is applied as given: take test files out of a
    model's first (verified_diff)."""
    nonce = secrets.token_hex(16)
    request = {"nonce": nonce, "patch": diff, "test_patch": test_patch, "plugin": PYTEST_PLUGIN,
               "test_files": test_files, "timeout": timeout}
    limits = image.limits
    run_limits = replace(limits, wall_seconds=timeout + 30, cpu_seconds=max(limits.cpu_seconds, timeout + 10))
    result = pool.execute(image, Execution(program=RUNNER, files={"repo.tar.gz": archive},
                                           stdin=json.dumps(request).encode(), limits=run_limits))
    if result.status == Status.INFRA_ERROR:
        return TestRun("sandbox_error", result.reason)
    for line in reversed(result.stdout.decode("utf-8", "replace").splitlines()):
        if line.startswith(nonce + " "):
            report = json.loads(line[len(nonce) + 1:])
            return TestRun(report["stage"], report["detail"], report["results"])
    if result.status == Status.TIMEOUT:
        return TestRun("timeout", f"verification ran past its time limit: {result.reason}")
    tail = result.stderr.decode("utf-8", "replace")[-600:]
    return TestRun("sandbox_error", f"the harness gave no report ({result.status}: {result.reason}) {tail}")


def evaluate_patch(pool, image, *, inputs: dict, hidden: dict, diff: str, timeout: float) -> PatchOutcome:
    """Verify `diff` (the model's workspace diff, or a gold patch) against the task, in a fresh sandbox."""
    fail_to_pass, pass_to_pass = task_tests(hidden)
    if not fail_to_pass:
        return PatchOutcome("setup_failed", None, "the task names no FAIL_TO_PASS test")
    snapshot = inputs.get("repository")
    if not isinstance(snapshot, dict):
        return PatchOutcome("setup_failed", None, "the task has no repository snapshot (inputs.repository)")
    try:
        archive = snapshot_bytes(snapshot)
    except (KeyError, ValueError) as exc:
        return PatchOutcome("setup_failed", None, f"the repository snapshot is unusable: {exc}")
    test_patch = hidden.get("test_patch") or ""
    applied, dropped = verified_diff(diff, diff_paths(test_patch))
    run = run_tests(pool, image, archive=archive, diff=applied, test_patch=test_patch,
                    test_files=test_files(fail_to_pass + pass_to_pass), timeout=timeout)
    stage, detail = run.stage, run.detail
    if stage == "sandbox_error":
        return PatchOutcome("sandbox_error", None, detail, dropped=dropped)
    if stage == "setup":
        return PatchOutcome("setup_failed", None, detail, dropped=dropped)
    if stage == "test_patch":
        return PatchOutcome("setup_failed", None, f"the hidden test patch does not apply: {detail}", dropped=dropped)
    if stage == "patch":
        return PatchOutcome("patch_apply_failed", 0.0, f"the diff does not apply to the base: {detail}",
                            dropped=dropped)
    if stage == "timeout":
        return PatchOutcome("timeout", 0.0, detail[-1500:], dropped=dropped)
    results = run.results
    failing = [test for test in fail_to_pass + pass_to_pass if results.get(test) != "passed"]
    if failing:
        shown = ", ".join(f"{test} ({results.get(test, 'did not run')})" for test in failing[:5])
        more = f" and {len(failing) - 5} more" if len(failing) > 5 else ""
        return PatchOutcome("test_failed", 0.0, f"{len(failing)} test(s) without a pass: {shown}{more}\n"
                                                + detail[-1500:], results, failing, dropped)
    return PatchOutcome("pass", 1.0, f"{len(fail_to_pass)} FAIL_TO_PASS and {len(pass_to_pass)} PASS_TO_PASS "
                                     "tests passed", results, [], dropped)


def repository_tests_check(spec: RepositoryTests, sample, item, context) -> Outcome:
    if context.pool is None or context.image is None:
        return Outcome(value=None, status=INFRA_ERROR, evidence="no sandbox to run the tests in")
    diff = sample.files.get(DIFF_FILE, b"").decode("utf-8", "replace")
    outcome = evaluate_patch(context.pool, context.image, inputs=item.inputs, hidden=item.hidden, diff=diff,
                             timeout=spec.timeout_seconds)
    evidence = outcome.evidence + (f" | test files left as the base has them: {', '.join(outcome.dropped[:10])}"
                                   if outcome.dropped else "")
    if outcome.reward is None:
        return Outcome(value=None, status=INFRA_ERROR, evidence=f"{outcome.reason}: {evidence}")
    return Outcome.scored(outcome.reward, f"{outcome.reason}: {evidence}")


# --- validation (at import: SWE-bench's harness validates its gold patches the same way) --------------------

VALIDATION_PYTEST_PIN = "pytest==9.2.0"  # the test runner repository tasks are verified with (a python_packages layer)
REASONS = ("pass", "test_failed", "gold_apply_failed", "setup_failed", "sandbox_error", "timeout")


@dataclass
class Validation:
    """An instance's check at import: its gold patch must score 1 and no patch 0. `reason` is one of
    VALIDATION_REASONS: pass when both hold, else what went wrong first."""

    key: str
    reason: str
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.reason == "pass"


def validate_instance(pool, image, instance: dict, *, timeout: float) -> Validation:
    key, inputs, hidden = instance["key"], instance["inputs"], instance["hidden"]
    gold = evaluate_patch(pool, image, inputs=inputs, hidden=hidden, diff=hidden.get("patch") or "", timeout=timeout)
    if gold.reason == "patch_apply_failed":
        return Validation(key, "gold_apply_failed", gold.evidence)
    if gold.reason != "pass":
        return Validation(key, gold.reason, f"with the gold patch: {gold.evidence}")
    empty = evaluate_patch(pool, image, inputs=inputs, hidden=hidden, diff="", timeout=timeout)
    if empty.reason == "pass":
        return Validation(key, "test_failed", "the FAIL_TO_PASS tests already pass without any patch")
    if empty.reason != "test_failed":
        return Validation(key, empty.reason, f"without a patch: {empty.evidence}")
    if not set(task_tests(hidden)[0]) <= set(empty.failing):
        passing = sorted(set(task_tests(hidden)[0]) - set(empty.failing))
        return Validation(key, "test_failed", f"FAIL_TO_PASS tests that pass without the fix: {', '.join(passing)}")
    return Validation(key, "pass", gold.evidence)


# --- SWE-bench's instance format ------------------------------------------------------------------------------

SWE_BENCH_FIELDS = ("instance_id", "problem_statement", "patch", "test_patch", "FAIL_TO_PASS", "PASS_TO_PASS")
INSTANCE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")


def swe_bench_instance(row: dict, repos: Path) -> dict:
    """A task instance ({key, inputs, hidden}) from one SWE-bench row, its repository at the base read from
    `repos/<instance_id>/` or `repos/<instance_id>.tar.gz` (nothing is cloned). ValueError says what is wrong."""
    missing = [name for name in SWE_BENCH_FIELDS if name not in row]
    if missing:
        raise ValueError(f"missing {', '.join(missing)}")
    instance_id = row["instance_id"]
    if not isinstance(instance_id, str) or not INSTANCE_ID.match(instance_id):
        raise ValueError(f"instance_id {instance_id!r} must be letters, digits, '.', '_' and '-'")
    for name in ("problem_statement", "patch", "test_patch"):
        if not isinstance(row[name], str):
            raise ValueError(f"{name} must be text")
    tests = {}
    for name in ("FAIL_TO_PASS", "PASS_TO_PASS"):
        value = row[name]
        try:
            value = json.loads(value) if isinstance(value, str) else value
        except ValueError:
            raise ValueError(f"{name} is neither a list nor a JSON list of test ids") from None
        if not isinstance(value, list) or not all(isinstance(test, str) for test in value):
            raise ValueError(f"{name} must be a list of test ids")
        tests[name] = value
    if not tests["FAIL_TO_PASS"]:
        raise ValueError("FAIL_TO_PASS is empty: nothing would tell a fix from no fix")
    folder, archive = repos / instance_id, repos / f"{instance_id}.tar.gz"
    if folder.is_dir():
        files = directory_files(folder)
    elif archive.is_file():
        files = archive_files(archive)
    else:
        raise ValueError(f"no repository for it: neither {folder}/ nor {archive}")
    hidden = {"patch": row["patch"], "test_patch": row["test_patch"], **tests}
    hidden.update({name: row[name] for name in ("repo", "base_commit", "version") if isinstance(row.get(name), str)})
    return {"key": instance_id, "inputs": {"problem_statement": row["problem_statement"],
                                           "repository": snapshot_files(files)}, "hidden": hidden}

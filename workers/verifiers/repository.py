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

A diff (the model's, or a gold patch at import) is read as `git apply` reads it: git's own diffs and plain
unified diffs as diff -u writes them. What verification leaves out of it (the files above, a binary change, a
section that is not one file's plain diff, text that is no file's diff) is named with its reason in the evidence;
a diff of which nothing is left scores 0 as nothing_to_apply, without a sandbox.
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
REASONS = ("pass", "test_failed", "patch_apply_failed", "nothing_to_apply", "setup_failed", "sandbox_error",
           "timeout")


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
#
# Read here as `git apply` reads a patch (its apply.c: find_header, parse_git_diff_header, parse_fragment) rather
# than with unidiff or whatthepatch: verification must cut a diff where git apply, which applies it in the
# sandbox, cuts it, and judge each file's section alone, so that one section it cannot read (a workspace path
# holding a newline writes one) is left out while the others are applied. unidiff raises for the whole diff at the
# first line it does not expect and keeps quoted names quoted; whatthepatch loses the section after stray text.

_HUNK = re.compile(r"^@@ -\d+(?:,(\d+))? \+\d+(?:,(\d+))? @@")
_MODE_LINE = re.compile(r"^(new file mode|deleted file mode|old mode|new mode) \d{6}$")
_INDEX_LINE = re.compile(r"^(index [0-9a-f]+\.\.[0-9a-f]+( \d{6})?|(dis)?similarity index \d+%)$")  # git diff's own
# The lines git apply reads as part of a `diff --git` header; any other line ends the header.
_GIT_HEADER_LINES = ("--- ", "+++ ", "old mode ", "new mode ", "deleted file mode ", "new file mode ", "copy from ",
                     "copy to ", "rename old ", "rename new ", "rename from ", "rename to ", "similarity index ",
                     "dissimilarity index ", "index ")
# What diff -r, svn and cvs write between the files' sections: nothing to apply, nothing to report.
_NOISE = re.compile(r"^(Index: .*|=+|diff .*|Common subdirectories: .*|\s*)$")
# diff -N's stamp for a file that does not exist on that side (GNU diff writes it in local time).
_EPOCH = re.compile(r"^(1969-12-31|1970-01-01) (\d\d):(\d\d):00(?:\.0+)? ([-+])(\d\d)(\d\d)$")
_BINARY_NOTE = re.compile(r"^Binary files (.+) and (.+) differ$")
BINARY = "a binary change: verification applies text diffs only"


@dataclass(frozen=True)
class DiffSection:
    """One file's section of a diff: the paths it touches, the text of it verification would apply, its first and
    last line, and why it cannot be applied ("" when it can). A plain unified diff's section is rewritten as a git
    diff of the path read here, so that git apply reads no other path from it. Text between sections that is no
    file's diff is a section without paths."""

    paths: tuple[str, ...]
    text: str
    lines: tuple[int, int]
    problem: str = ""

    @property
    def name(self) -> str:
        first, last = self.lines
        return ", ".join(self.paths) or (f"line {first}" if first == last else f"lines {first}-{last}")


@dataclass(frozen=True)
class LeftOut:
    """A part of a diff that verification did not apply (a file's section, or lines of text), and why."""

    part: str
    reason: str

    def __str__(self) -> str:
        return f"{self.part} ({self.reason})"


def describe(left_out: list[LeftOut], limit: int = 10) -> str:
    """What was left out, for a person: the first `limit` parts with their reasons, then how many more."""
    more = f" and {len(left_out) - limit} more" if len(left_out) > limit else ""
    return "; ".join(str(part) for part in left_out[:limit]) + more


def _lines(text: str) -> list[str]:
    """The text's lines, each ending in a newline: one lost at the end (a patch stored stripped) is put back,
    as git apply reads no hunk line without one."""
    lines = text.split("\n")
    return [line + "\n" for line in (lines if lines[-1] else lines[:-1])]


def _bare(line: str) -> str:
    """A line without its ending, "\r\n" as well (git apply reads a header written with Windows line endings)."""
    return line[:-1].removesuffix("\r")


def _starts_section(lines: list[str], index: int) -> bool:
    """Whether a file's section starts here, as git apply finds one: a `diff --git` line, or `--- ` then `+++ `
    then a hunk."""
    line = lines[index]
    return line.startswith("diff --git ") or _BINARY_NOTE.match(_bare(line)) is not None or (
        line.startswith("--- ") and index + 2 < len(lines) and lines[index + 1].startswith("+++ ")
        and lines[index + 2].startswith("@@ -"))


def _hunks(lines: list[str], index: int) -> tuple[int, str]:
    """Where the hunks from `index` on end, counted as git apply counts them, and what is wrong with them ("" when
    nothing is); a broken hunk's section runs on to where the next section starts."""
    while index < len(lines) and lines[index].startswith("@@ -"):
        hunk = _HUNK.match(lines[index])
        if hunk is None:
            return _next_section(lines, index + 1), "a hunk header it cannot read"
        old, new = int(hunk[1] or 1), int(hunk[2] or 1)
        index += 1
        while index < len(lines) and (old > 0 or new > 0 or lines[index].startswith("\\")):
            kind = lines[index][:1]
            if kind in (" ", "\n") and old > 0 and new > 0:  # "\n": an empty context line, as git apply reads it
                old, new = old - 1, new - 1
            elif kind == "-" and old > 0:
                old -= 1
            elif kind == "+" and new > 0:
                new -= 1
            elif kind != "\\":
                return _next_section(lines, index), "a hunk whose line counts do not add up"
            index += 1
        if old or new:
            return index, "a hunk cut short"
    return index, ""


def _next_section(lines: list[str], index: int) -> int:
    while index < len(lines) and not _starts_section(lines, index):
        index += 1
    return index


def _binary_end(lines: list[str], index: int) -> int:
    """Where a binary change starting at `index` ends: a "Binary files ... differ" line, or "GIT binary patch"
    and its one or two blocks (literal or delta, each closed by an empty line)."""
    if not lines[index].startswith("GIT binary patch"):
        return index + 1
    index += 1
    for _ in range(2):
        if index < len(lines) and lines[index].startswith(("literal ", "delta ")):
            while index < len(lines) and lines[index] != "\n":
                index += 1
            index += 1
    return min(index, len(lines))


def _plain_path(path: str) -> str:
    """Why `path` is not a plain relative path inside the repository ("" when it is)."""
    parts = path.split("/")
    if path.startswith('"'):
        return "a quoted file name, which verification does not read"
    if path != path.strip() or any(part in ("", ".", "..") for part in parts):
        return "a path that is not a plain one inside the repository"
    return ""


def _git_header_paths(rest: str) -> tuple[str, ...] | None:
    """The paths of `diff --git a/X b/Y`: X alone when both are the same (then X may hold spaces), else X and Y
    when neither does; None when it cannot be read so (a quoted name)."""
    same = (len(rest) - 5) // 2
    if rest == f"a/{rest[2:2 + same]} b/{rest[2:2 + same]}" and same > 0:
        return (rest[2:2 + same],)
    names = re.fullmatch(r"a/(\S+) b/(\S+)", rest)
    return tuple(sorted({names[1], names[2]})) if names else None


def _git_section(lines: list[str], start: int) -> tuple[DiffSection, int]:
    """A `diff --git` section, kept as it is when every line of its header names its own paths (git apply would
    patch another file named on a --- or +++ line) and its hunks add up."""
    rest = _bare(lines[start])[len("diff --git "):]
    paths = _git_header_paths(rest)
    end = start + 1
    while end < len(lines) and lines[end].startswith(_GIT_HEADER_LINES):
        end += 1
    header = [_bare(line) for line in lines[start + 1:end]]
    if end < len(lines) and (lines[end].startswith("GIT binary patch") or _BINARY_NOTE.match(_bare(lines[end]))):
        end, problem = _binary_end(lines, end), BINARY
    else:
        hunks_from = end
        end, problem = _hunks(lines, end)
        if not problem and end == hunks_from and not header:
            problem = "a diff header with no change under it"
        elif not problem and end > hunks_from and not {"--- ", "+++ "} <= {line[:4] for line in header}:
            problem = "hunks without the --- and +++ lines that name their file"
    if paths is None:
        problem = "file names it cannot read (quoted, or not a/… b/…)"
    elif not problem:
        problem = next(filter(None, map(_plain_path, paths)), "")
    if paths is not None and not problem:
        names = {"/dev/null", *(f"{side}/{path}" for path in paths for side in "ab")}
        moved = {f"{kind} {way} {path}" for path in paths for kind in ("rename", "copy") for way in ("from", "to")}
        if not all(_MODE_LINE.match(line) or _INDEX_LINE.match(line) or line in moved
                   or (line[:4] in ("--- ", "+++ ") and line[4:].split("\t")[0] in names) for line in header):
            problem = "not one file's plain diff: a line of its header names another file"
    text = "".join(lines[start:end])
    return DiffSection(paths or (rest,), text, (start + 1, end), problem), end


def _plain_name(field: str) -> tuple[str | None, str]:
    """The path on one side of a plain unified diff's `--- ` or `+++ ` line (None: no file on that side, as
    /dev/null or diff -N's epoch stamp says), and why it cannot be used ("" when it can). The name ends at a
    tab (a timestamp follows); one leading folder is taken off (a/, b/, old/, new/: git apply's -p1), none
    when the name has no folder (git apply's guess for diff's `--- x`)."""
    name, _, stamp = field.partition("\t")
    epoch = _EPOCH.match(stamp.strip())
    if epoch:
        hours, minutes, sign, zone_hours, zone_minutes = epoch.groups()[1:]
        offset = (int(zone_hours) * 60 + int(zone_minutes)) * (1 if sign == "+" else -1)
        if (int(hours) * 60 + int(minutes) - offset) % (24 * 60) == 0:
            return None, ""
    if name == "/dev/null":
        return None, ""
    if name.startswith('"'):
        return name, _plain_path(name)
    path = name.split("/", 1)[1] if "/" in name else name
    return path, _plain_path(path)


def _plain_section(lines: list[str], start: int) -> tuple[DiffSection, int]:
    """A plain unified diff's section (`--- `, `+++ `, hunks), rewritten as a git diff of the one file git apply
    would patch: the +++ side's path, or the --- side's when it is the +++ side's with something added (x and
    x.orig), as git apply chooses."""
    (old, old_problem), (new, new_problem) = (_plain_name(_bare(line)[4:]) for line in lines[start:start + 2])
    end, problem = _hunks(lines, start + 2)
    if old is None and new is None:
        path, problem = "/dev/null", problem or "no file on either side"
    elif new is None or (old is not None and len(old) < len(new) and new.startswith(old)):
        path, problem = old, problem or old_problem
    else:
        path, problem = new, problem or new_problem
    mode = "new file mode 100644\n" if old is None else "deleted file mode 100644\n" if new is None else ""
    text = (f"diff --git a/{path} b/{path}\n{mode}--- {'/dev/null' if old is None else 'a/' + path}\n"
            f"+++ {'/dev/null' if new is None else 'b/' + path}\n" + "".join(lines[start + 2:end]))
    return DiffSection((path,), text, (start + 1, end), problem), end


def _binary_note(lines: list[str], start: int) -> tuple[DiffSection, int]:
    """diff -r's "Binary files a/x and b/x differ" standing alone: a change nothing can apply."""
    sides = _BINARY_NOTE.match(_bare(lines[start])).groups()
    paths = {path for path, _ in map(_plain_name, sides) if path is not None}
    return DiffSection(tuple(sorted(paths)), lines[start], (start + 1, start + 1), BINARY), start + 1


def diff_sections(diff: str) -> list[DiffSection]:
    """The diff cut into its files' sections where git apply cuts it: at each `diff --git` line and each plain
    unified diff's `--- `/`+++ ` pair before a hunk (as diff -u writes them, with or without a/ b/, /dev/null or
    timestamps), a section ending where its hunks' line counts end. What diff -r, svn or cvs write between files
    (Index:, ====, diff -ru ...) is skipped; other text there is a section without paths, to be reported."""
    lines = _lines(diff)
    sections, stray, index = [], [], 0

    def close_stray() -> None:
        if stray:
            excerpt = _bare(lines[stray[0] - 1])
            excerpt = excerpt if len(excerpt) <= 60 else excerpt[:57] + "..."
            sections.append(DiffSection((), "".join(lines[stray[0] - 1:stray[-1]]), (stray[0], stray[-1]),
                                        f"not part of any file's diff: {excerpt!r}"))
            stray.clear()

    while index < len(lines):
        if not _starts_section(lines, index):
            if not _NOISE.match(_bare(lines[index])):
                stray.append(index + 1)
            index += 1
            continue
        close_stray()
        if lines[index].startswith("diff --git "):
            section, index = _git_section(lines, index)
        elif lines[index].startswith("--- "):
            section, index = _plain_section(lines, index)
        else:
            section, index = _binary_note(lines, index)
        sections.append(section)
    close_stray()
    return sections


def diff_paths(diff: str) -> set[str]:
    """Every path the diff's sections name, those verification would leave out included."""
    return {path for section in diff_sections(diff) for path in section.paths}


def is_test_path(path: str) -> bool:
    """A test file by the conventions pytest collects (tests/ or test/ folders, test_*.py, *_test.py)."""
    parts = PurePosixPath(path).parts
    name = parts[-1] if parts else ""
    return any(part in ("tests", "test", "testing") for part in parts[:-1]) or name.startswith("test_") \
        or name.endswith("_test.py") or name == "tests.py"


def is_steering_path(path: str) -> bool:
    name = PurePosixPath(path).name
    return name in STEERING_FILES or name.endswith(".pth")


def _kept_as_the_base_has_it(path: str, protected: set[str]) -> str:
    """Why verification keeps the base's copy of `path` whatever a diff says ("" when it does not)."""
    if path in protected:
        return "a file of the hidden tests"
    if is_test_path(path):
        return "a test file"
    if is_steering_path(path):
        return "steers pytest or the interpreter"
    return ""


def verified_diff(diff: str, protected: set[str]) -> tuple[str, list[LeftOut]]:
    """The part of a diff (a model's, or a gold patch) that verification applies, and what it left out and why: a
    section touching a test file, a file of `protected` (the hidden test patch's) or a file that steers pytest
    is left out whole, so those files stay as the base has them; so is a binary change, a section that is not
    one file's plain diff, and text that is no file's diff."""
    kept, left_out = [], []
    for section in diff_sections(diff):
        reason = section.problem or next(
            filter(None, (_kept_as_the_base_has_it(path, protected) for path in section.paths)), "")
        if reason:
            left_out.append(LeftOut(section.name, reason))
        else:
            kept.append(section.text)
    return "".join(kept), left_out


# --- verification ------------------------------------------------------------------------------------------

@dataclass
class PatchOutcome:
    """What verifying one diff against a task found. `reason` is one of REASONS; `reward` is None when the
    task could not be verified (setup_failed, sandbox_error); `left_out` is what verification did not apply of
    the diff (verified_diff)."""

    reason: str
    reward: float | None
    evidence: str = ""
    results: dict[str, str] = field(default_factory=dict)
    failing: list[str] = field(default_factory=list)
    left_out: list[LeftOut] = field(default_factory=list)

    @property
    def summary(self) -> str:
        """The evidence, after what was left out of the diff (first: pytest's output that follows can be long)."""
        return f"left out of the diff: {describe(self.left_out)}\n{self.evidence}" if self.left_out else self.evidence


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
    applied, left_out = verified_diff(diff, diff_paths(test_patch))
    if diff.strip() and not applied:  # the base alone, which fails the FAIL_TO_PASS tests: no sandbox needed
        return PatchOutcome("nothing_to_apply", 0.0, "nothing of the diff is left for verification to apply",
                            left_out=left_out)
    run = run_tests(pool, image, archive=archive, diff=applied, test_patch=test_patch,
                    test_files=test_files(fail_to_pass + pass_to_pass), timeout=timeout)
    stage, detail = run.stage, run.detail
    if stage == "sandbox_error":
        return PatchOutcome("sandbox_error", None, detail, left_out=left_out)
    if stage == "setup":
        return PatchOutcome("setup_failed", None, detail, left_out=left_out)
    if stage == "test_patch":
        return PatchOutcome("setup_failed", None, f"the hidden test patch does not apply: {detail}",
                            left_out=left_out)
    if stage == "patch":
        return PatchOutcome("patch_apply_failed", 0.0, f"the diff does not apply to the base: {detail}",
                            left_out=left_out)
    if stage == "timeout":
        return PatchOutcome("timeout", 0.0, detail[-1500:], left_out=left_out)
    results = run.results
    failing = [test for test in fail_to_pass + pass_to_pass if results.get(test) != "passed"]
    if failing:
        shown = ", ".join(f"{test} ({results.get(test, 'did not run')})" for test in failing[:5])
        more = f" and {len(failing) - 5} more" if len(failing) > 5 else ""
        return PatchOutcome("test_failed", 0.0, f"{len(failing)} test(s) without a pass: {shown}{more}\n"
                                                + detail[-1500:], results, failing, left_out)
    return PatchOutcome("pass", 1.0, f"{len(fail_to_pass)} FAIL_TO_PASS and {len(pass_to_pass)} PASS_TO_PASS "
                                     "tests passed", results, [], left_out)


def repository_tests_check(spec: RepositoryTests, sample, item, context) -> Outcome:
    if context.pool is None or context.image is None:
        return Outcome(value=None, status=INFRA_ERROR, evidence="no sandbox to run the tests in")
    diff = sample.files.get(DIFF_FILE, b"").decode("utf-8", "replace")
    outcome = evaluate_patch(context.pool, context.image, inputs=item.inputs, hidden=item.hidden, diff=diff,
                             timeout=spec.timeout_seconds)
    if outcome.reward is None:
        return Outcome(value=None, status=INFRA_ERROR, evidence=f"{outcome.reason}: {outcome.summary}")
    return Outcome.scored(outcome.reward, f"{outcome.reason}: {outcome.summary}")


# --- validation (at import: SWE-bench's harness validates its gold patches the same way) --------------------

VALIDATION_REASONS = ("pass", "test_failed", "gold_apply_failed", "gold_nothing_to_apply", "setup_failed",
                      "sandbox_error", "timeout")


@dataclass
class Validation:
    """An instance's check at import: its gold patch must score 1 and no patch 0. `reason` is one of
    VALIDATION_REASONS: pass when both hold, else what went wrong first; `left_out` is what verification did not
    apply of the gold patch, which a pass reports too."""

    key: str
    reason: str
    detail: str = ""
    left_out: list[LeftOut] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.reason == "pass"

    @property
    def report(self) -> str:
        """The outcome in a line for a person: the reason, then what went wrong or what verification left out of
        the gold patch."""
        if not self.ok:
            return f"{self.reason} ({self.detail[:300]})"
        return f"pass (left out of its gold patch: {describe(self.left_out)})" if self.left_out else "pass"


def validate_instance(pool, image, instance: dict, *, timeout: float) -> Validation:
    key, inputs, hidden = instance["key"], instance["inputs"], instance["hidden"]
    gold = evaluate_patch(pool, image, inputs=inputs, hidden=hidden, diff=hidden.get("patch") or "", timeout=timeout)
    if gold.reason == "patch_apply_failed":
        return Validation(key, "gold_apply_failed", gold.summary, gold.left_out)
    if gold.reason == "nothing_to_apply":
        return Validation(key, "gold_nothing_to_apply", gold.summary, gold.left_out)
    if gold.reason != "pass":
        return Validation(key, gold.reason, f"with the gold patch: {gold.summary}", gold.left_out)
    empty = evaluate_patch(pool, image, inputs=inputs, hidden=hidden, diff="", timeout=timeout)
    if empty.reason == "pass":
        return Validation(key, "test_failed", "the FAIL_TO_PASS tests already pass without any patch")
    if empty.reason != "test_failed":
        return Validation(key, empty.reason, f"without a patch: {empty.evidence}")
    if not set(task_tests(hidden)[0]) <= set(empty.failing):
        passing = sorted(set(task_tests(hidden)[0]) - set(empty.failing))
        return Validation(key, "test_failed", f"FAIL_TO_PASS tests that pass without the fix: {', '.join(passing)}")
    return Validation(key, "pass", gold.summary, gold.left_out)


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

"""Sandbox sessions on both backends: one sandbox held across calls, its workspace (files, packages installed in
it, the working directory) persisting, background processes gone after each call, a git-style diff against the
prepared base, and the session's own limits. One module pool per backend (conftest.py); each test opens its own
sessions."""

import shutil
import subprocess
import time

import pytest

from workers.definitions.specs import SessionSettings
from workers.sandbox import SandboxImage
from workers.sandbox.session import SessionLimitReached, SessionLost, WorkspaceSource
from workers.sandbox.types import Limits

IMAGE = SandboxImage(key="test/session@1", layers=({"type": "base", "image": "python-3.11"},),
                     limits=Limits(cpu_seconds=5, wall_seconds=5, memory_mb=128, disk_mb=32), warm_pool_size=1)
# Idle and lifetime bounds far above what a test takes, even while CI's parallel test processes slow a docker
# session's start to tens of seconds (the tests of those bounds set their own).
SPEC = SessionSettings(idle_timeout=180, lifetime=360, max_calls=50, disk_mb=32, memory_mb=128, call_seconds=5)


@pytest.fixture(scope="module")
def repository(tmp_path_factory):
    root = tmp_path_factory.mktemp("repository")
    (root / "pkg").mkdir()
    (root / "pkg" / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    (root / "README").write_text("a small repository")  # no newline at its end
    (root / "old.txt").write_text("to be deleted\n")
    return WorkspaceSource.directory(root)


def _applies(tmp_path, source: WorkspaceSource, diff: str) -> dict[str, bytes]:
    """The base with `diff` applied by git (as verification replays it), as a listing of its files."""
    base = tmp_path / "base"
    shutil.copytree(source.path, base)
    done = subprocess.run(["git", "apply", "--whitespace=nowarn", "-"], cwd=base, input=diff, text=True,
                          capture_output=True)
    assert done.returncode == 0, done.stderr
    return {str(p.relative_to(base)): p.read_bytes() for p in sorted(base.rglob("*")) if p.is_file()}


def test_a_session_keeps_its_workspace_between_calls_and_diffs_against_its_base(pool, repository, tmp_path):
    with pool.open_session(IMAGE, SPEC, workspace=repository, timeout=60) as session:
        listed = session.exec("ls; cat README")
        assert listed.status == "ok" and b"pkg" in listed.stdout and b"a small repository" in listed.stdout
        # A file, a module installed for the user, and the shell's working directory carry into the next call.
        assert session.exec("mkdir -p notes && cd notes && echo kept > note.txt").cwd == "notes"
        site = ".local/lib/python3.11/site-packages"
        session.write_file(f"{site}/helper.py", b"VALUE = 41\n")
        carried = session.exec("cat note.txt; pwd; python3 -c 'import helper; print(helper.VALUE + 1)'")
        assert carried.stdout.decode().split() == ["kept", "/sandbox/notes", "42"]
        assert session.exec(["python3", "-c", "import os; print(os.getcwd())"], cwd=".").stdout == b"/sandbox\n"
        # The model's edits: one changed, one new, one deleted file; caches and the user's site left out of the diff.
        session.write_file("pkg/calc.py", b"def add(a, b):\n    return a + b\n")
        assert session.read_file("pkg/calc.py") == b"def add(a, b):\n    return a + b\n"
        session.exec("rm /sandbox/old.txt && printf tail >> /sandbox/README && rm -rf /sandbox/.local /sandbox/notes")
        session.exec(["python3", "-c", "import pkg.calc"], cwd=".")  # leaves a __pycache__ behind
        diff = session.diff()
    assert "diff --git a/pkg/calc.py b/pkg/calc.py" in diff and "deleted file mode" in diff and "pycache" not in diff
    files = _applies(tmp_path, repository, diff)
    assert files == {"README": b"a small repositorytail", "pkg/calc.py": b"def add(a, b):\n    return a + b\n"}


def test_each_session_gets_its_own_copy_of_the_prepared_workspace(pool, repository):
    spec = SPEC.model_copy(update={"prepare": ["echo prepared > PREPARED", "mkdir -p build"]})
    first = pool.open_session(IMAGE, spec, workspace=repository, timeout=60)
    second = pool.open_session(IMAGE, spec, workspace=repository, timeout=60)
    try:
        assert first.id != second.id
        first.exec("echo mine > pkg/calc.py")
        assert second.read_file("pkg/calc.py").startswith(b"def add")
        assert first.read_file("PREPARED") == second.read_file("PREPARED") == b"prepared\n"
        assert second.diff() == ""  # what the preparation did is the base, not a change
    finally:
        first.close()
        second.close()
    # The preparation ran once for both (a cached layer), not once per session.
    builds = pool.backend.layers.builds if hasattr(pool.backend, "layers") else pool.backend.builds
    reopened = pool.open_session(IMAGE, spec, workspace=repository, timeout=60)
    reopened.close()
    assert (pool.backend.layers.builds if hasattr(pool.backend, "layers") else pool.backend.builds) == builds


def test_background_processes_end_with_their_call_unless_the_session_keeps_them(pool):
    count = "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline; echo; done | grep -c '^sleep 300' || true"
    with pool.open_session(IMAGE, SPEC, timeout=60) as session:
        started = session.exec("sleep 300 & echo started")
        assert started.status == "ok" and started.wall_seconds < 3
        assert session.exec(count).stdout.strip() == b"0"
    keeping = SPEC.model_copy(update={"keep_background": True})
    with pool.open_session(IMAGE, keeping, timeout=60) as session:
        session.exec("sleep 300 > /dev/null 2>&1 &")
        assert session.exec(count).stdout.strip() == b"1"


def test_paths_outside_the_workspace_and_missing_files_are_refused(pool):
    with pool.open_session(IMAGE, SPEC, timeout=60) as session:
        for path in ("../etc/passwd", "/etc/passwd", "a/../../x"):
            with pytest.raises(ValueError):
                session.read_file(path)
        with pytest.raises(FileNotFoundError):
            session.read_file("missing.txt")
        session.exec(["python3", "-c", "import os; os.symlink('/etc/passwd', 'link'); os.mkdir('folder')"])
        with pytest.raises(FileNotFoundError):
            session.read_file("link")  # a symlink as the last component is never followed
        with pytest.raises(IsADirectoryError):
            session.read_file("folder")
        # A command that fails is a result, not an error of the session.
        failed = session.exec("exit 3")
        assert failed.status == "error" and failed.exit_code == 3 and session.alive


def test_a_session_ends_at_its_limits(pool):
    with pool.open_session(IMAGE, SPEC.model_copy(update={"max_calls": 2}), timeout=60) as session:
        session.exec("true")
        session.write_file("x", b"1")
        with pytest.raises(SessionLimitReached) as spent:
            session.exec("true")
        assert spent.value.limit == "calls"
    session = pool.open_session(IMAGE, SPEC.model_copy(update={"lifetime": 1.5}), timeout=60)
    slow = session.exec("sleep 5")  # cut at the session's remaining lifetime, not at the call's 5 s
    assert slow.status == "timeout" and slow.wall_seconds < 3
    with pytest.raises(SessionLimitReached) as over:
        session.exec("true")
    assert over.value.limit == "lifetime" and session.closed


def test_a_session_idle_past_its_timeout_or_whose_sandbox_died_is_lost(pool):
    session = pool.open_session(IMAGE, SPEC.model_copy(update={"idle_timeout": 0.5}), timeout=60)
    deadline = time.monotonic() + 10
    while session.alive and time.monotonic() < deadline:
        time.sleep(0.1)
    with pytest.raises(SessionLost, match="without a call"):
        session.exec("true")
    session = pool.open_session(IMAGE, SPEC, timeout=60)
    session._lease.sandbox.destroy()  # the host lost it (a crash, an OOM kill of the whole sandbox)
    with pytest.raises(SessionLost):
        session.exec("true")


def test_a_program_that_takes_its_sandbox_down_ends_the_session_by_its_own_doing(pool):
    """Not an infrastructure error (which would be retried and never scored): the policy reads the result, and the
    trajectory ends there and is verified as it stands."""
    session = pool.open_session(IMAGE, SPEC, timeout=60)
    result = session.exec("kill -9 -1")
    assert result.status == "killed" and not session.alive
    with pytest.raises(SessionLimitReached) as ended:
        session.exec("true")
    assert ended.value.limit == "sandbox_killed"

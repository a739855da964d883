"""Sandbox sessions: one sandbox held for a whole trajectory, with a workspace that persists between calls.

A task template that declares `session: {...}` (workers/definitions/specs.py: SessionSettings, the one type of
a session's settings, the spec's and the sandbox's) gets, per trajectory, one sandbox of its image held from its
first tool call (or from the start when the session has `prepare` commands) until the trajectory ends, is
cancelled or times out. Every call execs a new process in the same
workspace: files, installed packages (pip --user lands in the workspace) and the working directory persist;
background processes die at the end of the call that started them unless the spec keeps them
(`keep_background`).

    session = pool.open_session(image, SessionSettings(idle_timeout=300, lifetime=1800, max_calls=100),
                                workspace=WorkspaceSource.directory(repo_dir))
    with session:
        result = session.exec("pip install -e . && pytest -x -q", timeout=120)   # a str runs under bash -c
        session.write_file("pkg/mod.py", b"...")
        text = session.read_file("pkg/mod.py").decode()
        patch = session.diff()   # git-style unified diff of the workspace against its base
    # close(): the sandbox is reset (or destroyed) and goes back to the pool, on every exit path

Where the workspace comes from and what "prepared" means:
- The workspace's base is the image's files plus, if given, a `WorkspaceSource` (a host directory, or a .tar /
  .tar.gz of one), with the session's `prepare` commands run on top of it once, without network, as the sandbox
  user. The result is cached per (image, source digest, prepare commands) — the *prepared workspace* — so
  preparing a repository is paid once per image, not per trajectory.
- Each session gets its own copy of the prepared workspace, made while its sandbox sits warm in the pool
  (copy-on-write where the backend allows), so opening a session costs a pool acquire.
- `diff()` compares the workspace with that base: what the trajectory changed, and nothing the preparation did.

Limits and their errors (the rollout maps them onto the trajectory):
- `SessionLimitReached`: the session's own budget is spent (max_calls, lifetime), or a program the policy ran
  killed the sandbox (or ran it out of memory as a whole) — the call that did it returns its result, the next
  raises: the policy's doing, so the trajectory ends as a limit hit and is still verified.
- `SessionLost`: the sandbox died between calls, its host is gone, or it was reclaimed after `idle_timeout`
  without a call: an infrastructure error, the trajectory is retried, never scored.
- A program's own failure (non-zero exit, its timeout, killed for memory or output) is a normal result with that
  status, exactly as for a one-shot Execution; the session lives on.

Paths given to read_file / write_file / exec(cwd=) are relative to the workspace root (an absolute path must lie
inside it); a path that leaves it raises ValueError. No Django here.
"""

from __future__ import annotations

import hashlib
import os
import tarfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

from workers.definitions.specs import SessionSettings

WORKSPACE_ROOT = "/sandbox"  # the workspace as the program sees it (its cwd at the first call)
# Where WorkspaceSource.from_bytes keeps archives it was handed in memory, by content: root's alone.
SOURCE_DIR = Path("/var/tmp/posttrain-studio/workspace-sources")
DIFF_EXCLUDE = ("__pycache__", "*.pyc", ".pytest_cache", "*.egg-info", ".mypy_cache", ".ruff_cache")


class SessionError(Exception):
    """Base of the session's own errors (never raised for what a program does)."""


class SessionLost(SessionError):
    """The session cannot go on through no fault of the policy: its sandbox died, its host is gone, it was
    reclaimed after `idle_timeout` without a call, or the pool closed. An infrastructure error: the trajectory is
    retried, never scored."""


class SessionLimitReached(SessionError):
    """The session cannot go on by the policy's doing: its budget is spent (`max_calls` calls, or its `lifetime`),
    or a program of the policy's took the sandbox down during a call. Not an error of the machinery: the trajectory
    ends and is verified as it stands. `limit` names which: "calls", "lifetime" or "sandbox_killed"."""

    def __init__(self, limit: str, message: str):
        super().__init__(message)
        self.limit = limit


@dataclass(frozen=True)
class WorkspaceSource:
    """A host directory or archive (.tar, .tar.gz, .tgz) whose contents become the workspace's base (on top of the
    image's files). `digest` identifies the contents: the prepared-workspace cache is keyed by it, so a caller that
    already knows one (an instance's content hash) passes it and saves the hashing."""

    path: Path
    digest: str

    @classmethod
    def directory(cls, path: Path | str, digest: str | None = None) -> WorkspaceSource:
        path = Path(path)
        if not path.is_dir():
            raise ValueError(f"workspace source {path} is not a directory")
        return cls(path=path, digest=digest or tree_digest(path))

    @classmethod
    def from_bytes(cls, data: bytes, digest: str | None = None, *, folder: Path = SOURCE_DIR) -> WorkspaceSource:
        """An archive handed over in memory (a repository task's snapshot): kept in `folder` under its sha256,
        written once (to a temporary name, then renamed, so concurrent writers never see half of it)."""
        digest = digest or hashlib.sha256(data).hexdigest()
        if not all(c in "0123456789abcdef" for c in digest) or len(digest) != 64:
            raise ValueError("a workspace digest is a sha256 in hex")
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        path = folder / f"{digest}.tar"
        if not path.exists():
            temporary = folder / f".{digest}.{os.getpid()}.{id(data):x}"
            temporary.write_bytes(data)
            temporary.rename(path)
        return cls.archive(path, digest)

    @classmethod
    def archive(cls, path: Path | str, digest: str | None = None) -> WorkspaceSource:
        path = Path(path)
        if not path.is_file() or not tarfile.is_tarfile(path):
            raise ValueError(f"workspace source {path} is not a tar archive")
        return cls(path=path, digest=digest or file_digest(path))


def file_digest(path: Path) -> str:
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def tree_digest(root: Path) -> str:
    """sha256 over every regular file's relative path, mode bits and bytes, and every symlink's target, in path
    order; directories count through their contents."""
    digest = hashlib.sha256()
    for folder, dirs, files in os.walk(root):
        dirs.sort()
        for name in sorted(files + [d for d in dirs if os.path.islink(os.path.join(folder, d))]):
            path = Path(folder) / name
            relative = path.relative_to(root).as_posix()
            if path.is_symlink():
                digest.update(f"L {relative} {os.readlink(path)}\n".encode())
            elif path.is_file():
                digest.update(f"F {relative} {path.stat().st_mode & 0o111:o} {path.stat().st_size}\n".encode())
                digest.update(bytes.fromhex(file_digest(path)))
    return digest.hexdigest()


def prepared_image(image, spec: SessionSettings, workspace: WorkspaceSource | None):
    """The SandboxImage whose sandboxes a session of `spec` over `workspace` runs in: `image`'s layers plus a
    `workspace` layer (the source's contents and the prepare commands, built once and cached like any layer), the
    session's memory and disk limits. Its key names the exact preparation and limits, so the pool keeps one warm
    set per prepared workspace."""
    from dataclasses import replace

    from workers.definitions.canonical import canonical_json

    from .types import SandboxImage

    layer = {"type": "workspace", "source": str(workspace.path) if workspace else "",
             "digest": workspace.digest if workspace else "", "prepare": list(spec.prepare)}
    limits = replace(image.limits, memory_mb=spec.memory_mb, disk_mb=spec.disk_mb, wall_seconds=spec.call_seconds,
                     cpu_seconds=max(image.limits.cpu_seconds, spec.call_seconds))
    identity = hashlib.sha256(canonical_json({"layers": [*image.layers, layer], "limits": asdict(limits),
                                              "keep_background": spec.keep_background}).encode()).hexdigest()
    return SandboxImage(key=f"{image.key}+session-{identity[:16]}", layers=(*image.layers, layer), limits=limits,
                        warm_pool_size=image.warm_pool_size)


@dataclass
class SessionStats:
    """What a session cost; the rollout copies it into the trajectory."""

    calls: int = 0
    exec_seconds: float = 0.0
    cpu_seconds: float = 0.0
    open_seconds: float = 0.0  # from open_session to ready (waiting for a warm sandbox)
    limit_hit: str = ""  # "calls" | "lifetime" once SessionLimitReached was raised
    extra: dict = field(default_factory=dict)


class Session:
    """One sandbox held for one trajectory (SandboxPool.open_session makes it). Thread-safe for one caller at a
    time: calls of one session run one after another (a trajectory's tool calls are sequential).

    Every method but `close` raises SessionLost when the sandbox is gone and SessionLimitReached when the
    session's budget is spent; exec never raises for what the program does.
    """

    def __init__(self, lease, spec: SessionSettings, *, open_seconds: float = 0.0):
        import time

        self._lease, self.spec = lease, spec
        self.id = lease.sandbox.id
        self.image = lease.sandbox.image
        self.cwd = "."  # relative to the workspace root; a shell command's final `cd` carries into the next call
        self.stats = SessionStats(open_seconds=open_seconds)
        self.opened = time.monotonic()
        self.deadline = self.opened + spec.lifetime
        self.closed = False
        self.ended_by_program = ""  # why the program's own call ended the sandbox, if it did
        lease.idle_timeout, lease.deadline = spec.idle_timeout, self.deadline

    # --- calls ------------------------------------------------------------------------------------------------

    def exec(self, command: list[str] | str, *, timeout: float | None = None, cwd: str | None = None,
             env: dict[str, str] | None = None, stdin: bytes = b""):
        """Runs `command` (an argv, or a string for `bash -c`) as a new process in the workspace and returns its
        ExecutionResult (status ok | error | timeout | killed; `cwd` is where a shell command ended up).

        timeout: wall-clock seconds for this call, at most the spec's call_seconds and the session's remaining
        lifetime. cwd: where it starts (relative to the workspace root); default: where the last shell command
        left off. env: variables added to the sandbox's clean environment (PATH, HOME, LANG, PYTHONPATH)."""
        from dataclasses import replace

        from .types import Execution

        self._count_call()
        seconds = min(self.spec.call_seconds, timeout or self.spec.call_seconds, self._remaining())
        start_in = workspace_path(cwd if cwd is not None else self.cwd)
        if isinstance(command, str):
            shape = {"shell": command}
        elif command and all(isinstance(part, str) for part in command):
            shape = {"command": list(command)}
        else:
            raise ValueError("command must be a string (a bash script) or a non-empty list of strings (an argv)")
        limits = replace(self._lease.sandbox.image.limits, wall_seconds=seconds,
                         cpu_seconds=max(seconds, self._lease.sandbox.image.limits.cpu_seconds))
        execution = Execution(**shape, stdin=stdin, limits=limits, cwd=start_in, env=dict(env or {}),
                              keep_background=self.spec.keep_background, prefork=True)
        result = self._call(lambda: self._lease.run(execution))
        if result.status == "infra_error":
            self._lost(f"the session's sandbox failed: {result.reason}")
        if not self._lease.sandbox.alive:
            # The sandbox died while the program ran: the program's doing (it killed it, or ran it out of memory
            # as a whole), never the infrastructure's. The policy reads this result; the session ends at its next
            # call, and the trajectory is verified as it stands.
            self.ended_by_program = result.reason or "the sandbox died during the call"
        if result.cwd:
            self.cwd = result.cwd
        self.stats.exec_seconds += result.wall_seconds
        self.stats.cpu_seconds += result.cpu_seconds
        return result

    def read_file(self, path: str, *, limit: int = 1 << 20) -> bytes:
        """The first `limit` bytes of a regular file of the workspace. FileNotFoundError when there is none (or
        it is not a regular file), ValueError for a path outside the workspace."""
        self._count_call()
        reply = self._call(lambda: self._lease.call({"op": "read_file", "path": workspace_path(path),
                                                     "limit": limit}))
        return _decoded(reply, "content")

    def write_file(self, path: str, content: bytes, *, mode: int = 0o644) -> None:
        """Creates or replaces a file of the workspace (and its missing folders)."""
        import base64

        self._count_call()
        self._call(lambda: self._lease.call({"op": "write_file", "path": workspace_path(path), "mode": mode,
                                             "content": base64.b64encode(content).decode()}))

    def diff(self, *, exclude: tuple[str, ...] = DIFF_EXCLUDE, limit: int = 4 << 20) -> str:
        """The workspace against its base (the prepared workspace), as a git-style unified diff (`diff --git a/x
        b/x` headers, new and deleted files, `Binary files ... differ` for non-text ones) that `git apply` and
        `patch -p1` take. Names matching `exclude` (fnmatch on each path component) are left out. ValueError
        when the diff is longer than `limit` bytes."""
        self._count_call()
        reply = self._call(lambda: self._lease.call({"op": "diff", "exclude": list(exclude), "limit": limit}))
        if reply.get("too_long"):
            raise ValueError(f"the workspace's diff is longer than {limit} bytes")
        return reply["diff"]

    # --- life -------------------------------------------------------------------------------------------------

    def touch(self) -> None:
        """Counts as activity for `idle_timeout` (the rollout calls it while the model writes a long turn)."""
        import time

        self._lease.last_active = time.monotonic()

    @property
    def alive(self) -> bool:
        return not self.closed and not self._lease.expired and self._lease.sandbox.alive

    def close(self) -> None:
        """Gives the sandbox back (reset in the background, or destroyed); safe to call twice, never raises."""
        if not self.closed:
            self.closed = True
            self._lease.release()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # --- internals --------------------------------------------------------------------------------------------

    def _remaining(self) -> float:
        import time

        return self.deadline - time.monotonic()

    def _count_call(self) -> None:
        if self.ended_by_program:
            self.close()
            raise SessionLimitReached("sandbox_killed", f"the session's sandbox is gone: {self.ended_by_program}")
        if self.closed:
            raise SessionLost("the session is closed")
        if self._lease.expired:
            self._lost(self._lease.expired_reason or "the session's sandbox was reclaimed")
        if not self._lease.sandbox.alive:
            self._lost("the session's sandbox died between calls")
        if self._remaining() <= 0:
            self.stats.limit_hit = "lifetime"
            self.close()
            raise SessionLimitReached("lifetime", f"the session's lifetime of {self.spec.lifetime:g} s is over")
        if self.stats.calls >= self.spec.max_calls:
            self.stats.limit_hit = "calls"
            raise SessionLimitReached("calls", f"the session's {self.spec.max_calls} calls are spent")
        self.stats.calls += 1

    def _call(self, function):
        from .types import LeaseExpired
        from .zygote_client import SandboxError

        try:
            return function()
        except LeaseExpired as exc:
            self._lost(str(exc))
        except SandboxError as exc:
            self._lost(str(exc))
        except OSError as exc:  # raised by the sandbox for the caller's path: not found, not a file
            raise exc from None

    def _lost(self, reason: str):
        self.close()
        raise SessionLost(reason)


def workspace_path(path: str) -> str:
    """`path` (relative to the workspace root, or absolute inside it) as a normalised relative path; ValueError
    for one that leaves the workspace. The sandbox checks again (a symlink may point anywhere in it)."""
    if not isinstance(path, str) or "\0" in path:
        raise ValueError("a path must be a string without NUL bytes")
    absolute = os.path.normpath(os.path.join(WORKSPACE_ROOT, path))
    if absolute != WORKSPACE_ROOT and not absolute.startswith(WORKSPACE_ROOT + "/"):
        raise ValueError(f"{path!r} is outside the workspace ({WORKSPACE_ROOT})")
    return os.path.relpath(absolute, WORKSPACE_ROOT)


def _decoded(reply: dict, key: str) -> bytes:
    import base64

    return base64.b64decode(reply[key])

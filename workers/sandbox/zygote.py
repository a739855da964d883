"""The fork server that runs inside every sandbox (standard library only; runs under the sandbox's python3).

It starts once per sandbox, imports the image's modules, and then forks one child per execution, so a warm
run costs a fork instead of an interpreter start. It speaks length-prefixed JSON on stdin/stdout.

Inside the sandbox it is pid 2 (bubblewrap's init is pid 1), so after every run `kill(-1, SIGKILL)` removes
every process the program left behind, including grandchildren that called setsid, and nothing else. It makes
itself non-dumpable so a program running as the same uid cannot ptrace it or read its /proc entries.
"""

import base64
import ctypes
import difflib
import errno
import fnmatch
import gc
import json
import os
import resource
import select
import shutil
import signal
import stat
import struct
import sys
import time
import traceback
import types

WORKDIR = "/sandbox"
SCRATCH = ("/tmp", "/dev/shm")
IMAGE_FILES = "/image/files"
HEARTBEAT_SECONDS = 0.5
PR_SET_DUMPABLE = 4
SELF_SIGNALS = {signal.SIGSEGV, signal.SIGABRT, signal.SIGFPE, signal.SIGBUS, signal.SIGILL, signal.SIGSYS}


def _open_channel():
    """stdin/stdout (bubblewrap), or one connection on the unix socket named by ZYGOTE_SOCKET (docker, where
    the container's stdio is multiplexed by the engine)."""
    path = os.environ.pop("ZYGOTE_SOCKET", "")
    if not path:
        return os.fdopen(0, "rb", buffering=0), os.fdopen(1, "wb", buffering=0)
    import socket

    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1)
    listener.settimeout(60)  # a host that died before connecting never will: the container then ends itself
    try:
        connection, _ = listener.accept()
    except TimeoutError:
        sys.exit(1)
    connection.settimeout(None)
    listener.close()
    os.unlink(path)  # nobody else can connect once the host has
    os.dup2(connection.fileno(), 0)
    os.dup2(connection.fileno(), 1)
    connection.close()
    return os.fdopen(0, "rb", buffering=0), os.fdopen(1, "wb", buffering=0)


# The same framing as workers/sandbox/protocol.py; repeated because this file runs alone inside the sandbox.
_protocol_in, _protocol_out = _open_channel()


def send(message: dict) -> None:
    body = json.dumps(message).encode()
    _protocol_out.write(struct.pack(">I", len(body)) + body)


def receive() -> dict | None:
    header = _read_exactly(4)
    if header is None:
        return None
    return json.loads(_read_exactly(struct.unpack(">I", header)[0]))


def _read_exactly(size: int) -> bytes | None:
    chunks, remaining = [], size
    while remaining:
        chunk = _protocol_in.read(remaining)
        if not chunk:
            return None
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


def kill_everything_else(settle_seconds: float = 2.0) -> None:
    """SIGKILL every process but pid 1 and this one, and wait (`settle_seconds` at most) until they are gone: a
    killed process still counts against the sandbox's pids limit until it has exited and been reaped, so on a
    loaded machine the next program could find its fork budget spent by the last one's leftovers."""
    try:
        os.kill(-1, signal.SIGKILL)
    except ProcessLookupError:
        pass
    deadline = time.monotonic() + settle_seconds
    while True:
        while True:  # reap what was ours; orphans are reaped by pid 1
            try:
                if os.waitpid(-1, os.WNOHANG) == (0, 0):
                    break
            except ChildProcessError:
                break
        if not _other_processes() or time.monotonic() > deadline:
            return
        time.sleep(0.002)


def _other_processes() -> list[str]:
    """The sandbox's processes (its own pid namespace's /proc) other than pid 1 and this one."""
    me = str(os.getpid())
    try:
        return [name for name in os.listdir("/proc") if name.isdigit() and name not in ("1", me)]
    except OSError:  # no /proc of its own to read: nothing to wait for
        return []


def remove(path: str) -> None:
    """Delete a tree the program may have made hard to delete (directories without permissions)."""
    info = os.lstat(path)
    if stat.S_ISDIR(info.st_mode):
        os.chmod(path, 0o700)
        for entry in os.scandir(path):
            remove(entry.path)
        os.rmdir(path)
    else:
        os.unlink(path)


def reset() -> dict:
    """Back to the image's clean state: no process of the last run, empty scratch space, the image's files,
    and a fresh spare child."""
    global SPARE
    if SPARE is not None:
        SPARE.close()
        SPARE = None
    kill_everything_else()
    for path in (WORKDIR, *SCRATCH):
        try:
            os.chmod(path, 0o700 if path == WORKDIR else 0o1777)  # undo a chmod by the last program
        except PermissionError:
            pass  # a mount the sandbox user does not own (docker's /dev/shm), so nor could the program
        for entry in os.scandir(path):
            remove(entry.path)
        if os.listdir(path):
            raise OSError(f"{path} is not empty after the reset")
    if os.path.isdir(IMAGE_FILES):
        shutil.copytree(IMAGE_FILES, WORKDIR, dirs_exist_ok=True, symlinks=True)
    os.chdir(WORKDIR)
    SPARE = Spare()
    return {"op": "ready"}


def safe_path(relative: str, *, root_allowed: bool = False) -> str:
    full = os.path.normpath(os.path.join(WORKDIR, relative))
    if not full.startswith(WORKDIR + "/") and not (root_allowed and full == WORKDIR):
        raise ValueError(f"{relative!r} leaves the working directory")
    return full


def write_inputs(files: dict) -> None:
    for relative, encoded in files.items():
        path = safe_path(relative)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
        with os.fdopen(fd, "wb") as handle:
            handle.write(base64.b64decode(encoded))


def read_outputs(names: list, cap: int) -> tuple[dict, list]:
    found, missing = {}, []
    for relative in names:
        try:
            fd = os.open(safe_path(relative), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except (OSError, ValueError):
            missing.append(relative)
            continue
        with os.fdopen(fd, "rb") as handle:
            if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
                missing.append(relative)  # a fifo or device would hang or leak; only regular files come back
                continue
            found[relative] = base64.b64encode(handle.read(cap)).decode()
    return found, missing


class Spare:
    """The child that will run the next program, forked ahead of time: its fork, set-up and first page faults
    happen while nothing waits. It holds nothing of any request until it is started."""

    def __init__(self):
        self.out_r, out_w = os.pipe()
        self.err_r, err_w = os.pipe()
        control_r, self.control_w = os.pipe()
        self.cwd_fd = os.memfd_create("cwd")  # where a session's shell command leaves its final directory
        self.pid = os.fork()
        if self.pid == 0:
            os.close(self.out_r)
            os.close(self.err_r)
            os.close(self.control_w)
            child(control_r, out_w, err_w, self.cwd_fd)
        os.close(out_w)
        os.close(err_w)
        os.close(control_r)
        self.pidfd = os.pidfd_open(self.pid)

    def start(self, request: dict) -> None:
        message = json.dumps({key: request.get(key) for key in ("limits", "command", "stdin", "cwd", "env",
                                                                "shell")}).encode()
        with os.fdopen(self.control_w, "wb") as control:  # closing it tells the child the request is whole
            control.write(message)

    def final_cwd(self) -> str:
        """The directory a session's shell command ended in, relative to the workspace ("" if it did not say, or
        said something outside the workspace)."""
        try:
            os.lseek(self.cwd_fd, 0, os.SEEK_SET)
            reported = os.read(self.cwd_fd, 4096).decode("utf-8", "replace").strip().splitlines()
            if reported:
                return os.path.relpath(safe_path(reported[-1], root_allowed=True), WORKDIR)
        except (OSError, ValueError):
            pass
        return ""

    def close(self) -> None:
        for fd in (self.out_r, self.err_r, self.pidfd, self.cwd_fd):
            try:
                os.close(fd)
            except OSError:
                pass
        try:
            os.close(self.control_w)
        except OSError:
            pass


SPARE: Spare | None = None


# A session's shell command reports where it ended (its `cd`s carry into the next call) on fd 3, a memfd the zygote
# reads after the command exits. A command that replaces the EXIT trap or closes fd 3 just keeps the old directory.
SHELL_PROLOGUE = "trap 'pwd -P >&3 2>/dev/null' EXIT\n"


def child(control_fd: int, stdout_w: int, stderr_w: int, cwd_fd: int) -> None:
    """In the forked child: wait for the request, then limits, descriptors and the program. Never returns."""
    try:
        os.dup2(stdout_w, 1)
        os.dup2(stderr_w, 2)
        os.setsid()
        try:
            with open("/proc/self/oom_score_adj", "w") as handle:
                handle.write("1000")  # if memory runs out, the program goes first, not the zygote
        except OSError:
            pass
        exec(compile("_ = [str(n) for n in range(64)]", "warm-up", "exec"), {})  # first page faults, now
        with os.fdopen(control_fd, "rb") as control:
            request = json.loads(control.read())
        stdin_fd = os.memfd_create("stdin")
        os.write(stdin_fd, base64.b64decode(request.get("stdin") or ""))
        os.lseek(stdin_fd, 0, os.SEEK_SET)
        os.dup2(stdin_fd, 0)
        os.dup2(cwd_fd, 3)
        os.closerange(4, 1 << 16)
        limits = request["limits"]
        cpu = max(1, int(limits["cpu_seconds"] + 0.999))
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
        resource.setrlimit(resource.RLIMIT_NPROC, (limits["max_processes"], limits["max_processes"]))
        resource.setrlimit(resource.RLIMIT_FSIZE, (limits["max_file_bytes"], limits["max_file_bytes"]))
        resource.setrlimit(resource.RLIMIT_NOFILE, (limits["open_files"], limits["open_files"]))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        if limits.get("address_space_bytes"):
            space = limits["address_space_bytes"]
            resource.setrlimit(resource.RLIMIT_AS, (space, space))
        start_in = WORKDIR
        if request.get("cwd"):
            start_in = safe_path(request["cwd"], root_allowed=True)
            if not os.path.isdir(start_in):
                os.write(2, f"(the directory {request['cwd']} is gone: running in {WORKDIR})\n".encode())
                start_in = WORKDIR
        os.chdir(start_in)
        environment = {**os.environ, **(request.get("env") or {})}
        if request.get("shell") is not None:
            shell = "/bin/bash" if os.path.exists("/bin/bash") else "/bin/sh"
            os.execve(shell, [shell, "-c", SHELL_PROLOGUE + request["shell"]], environment)
        os.close(3)
        if request.get("command"):
            os.execvpe(request["command"][0], request["command"], environment)
        sys.stdin = open(0, closefd=False)
        sys.stdout = open(1, "w", buffering=1, closefd=False)
        sys.stderr = open(2, "w", buffering=1, closefd=False)
        sys.argv = ["main.py"]
        sys.path.insert(0, WORKDIR)
        run_main(os.path.join(WORKDIR, "main.py"))
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if exc.code is not None and not isinstance(exc.code, int):
            print(exc.code, file=sys.stderr)
    except BaseException as exc:
        tb = exc.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename == "<string>":
            tb = tb.tb_next  # the program's own frames only, not the zygote's
        traceback.print_exception(type(exc), exc, tb)
        code = 1
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code & 0xFF)


def run_main(path: str) -> None:
    """What `python main.py` does, minus the interpreter start (runpy.run_path costs 12 ms on its first call)."""
    with open(path, "rb") as handle:
        code = compile(handle.read(), path, "exec")
    module = types.ModuleType("__main__")
    module.__file__ = path
    module.__builtins__ = __builtins__
    sys.modules["__main__"] = module
    exec(code, module.__dict__)


def run(request: dict) -> dict:
    global SPARE
    limits = request["limits"]
    write_inputs(request.get("files", {}))
    spare, SPARE = SPARE or Spare(), None
    started = time.monotonic()
    spare.start(request)
    pid, pidfd, out_r, err_r = spare.pid, spare.pidfd, spare.out_r, spare.err_r
    captured = {out_r: bytearray(), err_r: bytearray()}
    totals = {out_r: 0, err_r: 0}
    cap, hard = limits["output_bytes"], limits["output_hard_bytes"]
    deadline = started + limits["wall_seconds"]
    next_beat = started + HEARTBEAT_SECONDS
    open_fds, status, reason, exited = {out_r, err_r}, None, "", False
    while not exited or open_fds:
        now = time.monotonic()
        if not exited and now >= deadline:
            status, reason = "timeout", f"ran past the {limits['wall_seconds']:g} s wall-clock limit"
            break
        if exited:  # the program is gone; whatever still holds a pipe open was left behind by it
            break
        if now >= next_beat:
            send({"op": "heartbeat"})
            next_beat = now + HEARTBEAT_SECONDS
        ready, _, _ = select.select([*open_fds, pidfd], [], [], max(0.0, min(deadline, next_beat) - now))
        for fd in ready:
            if fd == pidfd:
                exited = True
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                open_fds.discard(fd)
                continue
            totals[fd] += len(chunk)
            room = cap - len(captured[fd])
            if room > 0:
                captured[fd] += chunk[:room]
        if totals[out_r] + totals[err_r] > hard:
            status, reason = "killed", f"wrote more than {hard} bytes of output"
            break
    keep_background = request.get("keep_background") and status is None
    if status is not None:  # stop it now; the child is reaped first so its resource usage can be read
        os.kill(-1, signal.SIGKILL)
    _, wait_status, usage = os.wait4(pid, 0)
    if not keep_background:
        kill_everything_else()
    # Drain what the killed processes wrote before dying; a background process kept alive may write for ever, so
    # its output is read for a moment only.
    drain_until = time.monotonic() + (0.05 if keep_background else 3600)
    for fd in list(open_fds):
        while time.monotonic() < drain_until:
            ready, _, _ = select.select([fd], [], [], 0.05)
            chunk = os.read(fd, 65536) if ready else b""
            if not chunk:
                break
            totals[fd] += len(chunk)
            room = cap - len(captured[fd])
            if room > 0:
                captured[fd] += chunk[:room]
    cwd = spare.final_cwd() if request.get("shell") is not None else ""
    spare.close()
    wall = time.monotonic() - started
    exit_code = os.WEXITSTATUS(wait_status) if os.WIFEXITED(wait_status) else None
    signal_number = os.WTERMSIG(wait_status) if os.WIFSIGNALED(wait_status) else None
    cpu = usage.ru_utime + usage.ru_stime
    if status is None:
        status, reason = classify(exit_code, signal_number, cpu, limits)
    files, missing = read_outputs(request.get("collect", []), limits["max_file_bytes"])
    return {"op": "result", "status": status, "reason": reason, "exit_code": exit_code, "signal": signal_number,
            "stdout": base64.b64encode(bytes(captured[out_r])).decode(),
            "stderr": base64.b64encode(bytes(captured[err_r])).decode(),
            "stdout_truncated": totals[out_r] > cap, "stderr_truncated": totals[err_r] > cap,
            "wall_seconds": wall, "cpu_seconds": cpu, "peak_memory_mb": usage.ru_maxrss / 1024,
            "files": files, "missing_files": missing, "cwd": cwd}


def file_error(exc: BaseException) -> dict:
    kind = {errno.ENOENT: "not_found", errno.EISDIR: "is_a_directory", errno.EACCES: "permission",
            errno.EPERM: "permission", errno.ELOOP: "not_found", errno.ENOSPC: "no_space",
            errno.ENOTDIR: "not_found"}.get(getattr(exc, "errno", None), "invalid" if isinstance(exc, ValueError)
                                                                       else "os")
    return {"op": "error", "error": kind, "reason": str(exc)}


def read_file(request: dict) -> dict:
    """A session reads a file of its workspace: regular files only (a fifo would hang the zygote), no symlink as
    the last component."""
    try:
        fd = os.open(safe_path(request["path"]), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except (OSError, ValueError) as exc:
        return file_error(exc)
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        if stat.S_ISDIR(info.st_mode):
            return {"op": "error", "error": "is_a_directory", "reason": f"{request['path']} is a directory"}
        return {"op": "error", "error": "not_found", "reason": f"{request['path']} is not a regular file"}
    with os.fdopen(fd, "rb") as handle:
        return {"op": "file", "content": base64.b64encode(handle.read(request["limit"])).decode(),
                "size": info.st_size}


def write_file(request: dict) -> dict:
    try:
        path = safe_path(request["path"])
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, request.get("mode", 0o644) & 0o777)
        with os.fdopen(fd, "wb") as handle:
            handle.write(base64.b64decode(request["content"]))
    except (OSError, ValueError) as exc:
        return file_error(exc)
    return {"op": "written"}


def _tree(root: str, exclude: list) -> dict:
    """relative path -> lstat of every file and symlink under `root` (a symlink to a folder is an entry, never
    followed), leaving out names that match `exclude`."""
    found = {}
    for folder, dirs, files in os.walk(root):  # does not follow symlinks; those to folders come in `dirs`
        kept = [name for name in dirs if not any(fnmatch.fnmatch(name, pattern) for pattern in exclude)]
        dirs[:] = [name for name in kept if not os.path.islink(os.path.join(folder, name))]
        for name in [*files, *(name for name in kept if name not in dirs)]:
            if any(fnmatch.fnmatch(name, pattern) for pattern in exclude):
                continue
            path = os.path.join(folder, name)
            try:
                found[os.path.relpath(path, root)] = os.lstat(path)
            except OSError:
                pass
    return found


def _content(path: str, info) -> bytes:
    if stat.S_ISLNK(info.st_mode):
        return os.readlink(path).encode()
    if not stat.S_ISREG(info.st_mode):
        return b""
    with open(path, "rb") as handle:
        return handle.read()


def _git_mode(info) -> str:
    if stat.S_ISLNK(info.st_mode):
        return "120000"
    return "100755" if info.st_mode & 0o111 else "100644"


def _text_lines(data: bytes):
    """The lines of a text file, or None for a binary one (a NUL byte, or not UTF-8: git's own test is the NUL)."""
    if b"\0" in data:
        return None
    try:
        return data.decode("utf-8").splitlines(keepends=True)
    except UnicodeDecodeError:
        return None


def file_diff(relative: str, old, new, old_data: bytes, new_data: bytes) -> str:
    """One file's part of a git-style diff (`git apply` and `patch -p1` take it); old or new None for an added or
    deleted file."""
    header = [f"diff --git a/{relative} b/{relative}"]
    if old is None:
        header.append(f"new file mode {_git_mode(new)}")
    elif new is None:
        header.append(f"deleted file mode {_git_mode(old)}")
    elif _git_mode(old) != _git_mode(new):
        header += [f"old mode {_git_mode(old)}", f"new mode {_git_mode(new)}"]
    if old_data == new_data:
        return "\n".join(header) + "\n" if len(header) > 1 else ""
    before, after = _text_lines(old_data), _text_lines(new_data)
    source = "/dev/null" if old is None else f"a/{relative}"
    target = "/dev/null" if new is None else f"b/{relative}"
    if before is None or after is None:
        return "\n".join(header + [f"Binary files {source} and {target} differ"]) + "\n"
    out = ["\n".join(header + [f"--- {source}", f"+++ {target}"]) + "\n"]
    for line in list(difflib.unified_diff(before, after, n=3, lineterm=""))[2:]:
        if line.startswith("@@"):
            out.append(line + "\n")
        elif line.endswith("\n"):
            out.append(line)
        else:
            out.append(line + "\n\\ No newline at end of file\n")
    return "".join(out)


def workspace_diff(request: dict) -> dict:
    """The workspace against its base (the image's files, which every reset copies in), file by file in path
    order. A file whose size and modification time match the base's is taken as unchanged (the copy kept the
    times), as git's own index does: a program that forges both hides its change from the diff, and so from
    verification, which applies only the diff."""
    exclude, limit = request.get("exclude", []), request["limit"]
    base, work = _tree(IMAGE_FILES, exclude), _tree(WORKDIR, exclude)
    parts, size = [], 0
    for relative in sorted(set(base) | set(work)):
        old, new = base.get(relative), work.get(relative)
        if old is not None and new is not None and (old.st_size, old.st_mtime_ns, _git_mode(old)) == (
                new.st_size, new.st_mtime_ns, _git_mode(new)) and not stat.S_ISLNK(new.st_mode):
            continue
        try:
            old_data = _content(os.path.join(IMAGE_FILES, relative), old) if old is not None else b""
            new_data = _content(os.path.join(WORKDIR, relative), new) if new is not None else b""
        except OSError:
            continue  # unreadable (the program took its permissions away): not part of the diff
        part = file_diff(relative, old, new, old_data, new_data)
        size += len(part)
        if size > limit:
            return {"op": "diff", "too_long": True, "diff": ""}
        parts.append(part)
    return {"op": "diff", "diff": "".join(parts)}


def classify(exit_code, signal_number, cpu, limits) -> tuple[str, str]:
    if exit_code == 0:
        return "ok", ""
    if exit_code is not None:
        return "error", f"exited with status {exit_code}"
    name = signal.Signals(signal_number).name
    if signal_number == signal.SIGXCPU or cpu >= limits["cpu_seconds"]:
        return "timeout", f"used its {limits['cpu_seconds']:g} s of CPU time ({name})"
    if signal_number == signal.SIGXFSZ:
        return "killed", f"wrote a file larger than {limits['max_file_bytes']} bytes ({name})"
    if signal_number in SELF_SIGNALS:
        return "error", f"crashed with {name}"
    return "killed", f"killed by {name}"


SESSION_OPS = {"read_file": read_file, "write_file": write_file, "diff": workspace_diff}


def main() -> None:
    global SPARE
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    for module in json.loads(sys.argv[1]) if len(sys.argv) > 1 else []:
        try:
            __import__(module)
        except Exception:
            pass  # a module that is not importable is the program's problem, not the sandbox's
    gc.freeze()  # objects from start-up stay out of the collector, so forked children copy fewer pages
    send(reset())
    while (request := receive()) is not None:
        op = request["op"]
        if op == "ping":
            send({"op": "pong"})
        elif op == "reset":
            try:
                send(reset())
            except OSError as exc:
                send({"op": "reset_failed", "reason": str(exc)})
        elif op == "run":
            # Heard before the program exists: a sandbox that says nothing after a run request never ran it
            # (the host counts that as its own fault), while one that goes quiet later was stopped by the program.
            send({"op": "heartbeat"})
            try:
                send(run(request))
            except Exception as exc:  # a fault of the sandbox itself, never of the program
                kill_everything_else()
                send({"op": "result", "status": "infra_error", "reason": f"sandbox fault: {exc!r}"})
            if request.get("prefork") and SPARE is None:
                SPARE = Spare()  # a session's next call starts from a spare too; forked after the reply
        elif op in SESSION_OPS:
            try:
                send(SESSION_OPS[op](request))
            except Exception as exc:  # a fault of the sandbox itself, never of the program
                send({"op": "error", "error": "sandbox", "reason": f"sandbox fault: {exc!r}"})
        elif op == "exit":
            break


if __name__ == "__main__":
    main()

"""The `process` backend, the embedded default: each sandbox is a bubblewrap jail around a warm fork server.

What a sandbox gets (and what `isolation` reports):
- new user, pid, network, ipc, uts and mount namespaces (`--unshare-all`; the network only if the image asks);
- its own unprivileged uid, so RLIMIT_NPROC counts this sandbox alone and no host file owned by root or by
  the studio is writable (or readable where it is private);
- a filesystem of /usr read-only, the image's layer read-only at /image, and size-capped tmpfs for its
  working directory (/sandbox), /tmp and /dev/shm: no view of the project, its settings or its database;
- an environment of PATH, HOME, LANG and PYTHONPATH only: no secret or setting of the host;
- cgroups for memory and processes where the machine allows, rlimits for CPU time, file size, open files;
- after every run, `kill(-1)` from inside the pid namespace; on destroy, the namespace's init is killed,
  which takes every process in it down with it.
"""

import base64
import itertools
import os
import subprocess
import threading
import time
import uuid
from pathlib import Path

from .cgroups import SandboxCgroup
from .layers import LayerCache
from .protocol import Channel, ChannelClosed, ChannelTimeout
from .types import Execution, ExecutionResult, Limits, SandboxImage, Status

ZYGOTE_SOURCE = (Path(__file__).parent / "zygote.py").read_text()
SANDBOX_PYTHON = "/usr/bin/python3"
START_TIMEOUT = 30.0
HEARTBEAT_TIMEOUT = 3.0  # a sandbox that sends nothing for this long during a run has stopped answering
WALL_GRACE = 2.0  # the zygote enforces the wall limit; the host kills the whole sandbox this much later
UID_BASE = 200_000  # sandbox uids: far from any account on the machine, one per live sandbox

_uids = itertools.count()
_uid_lock = threading.Lock()


def _next_uid() -> int:
    with _uid_lock:
        return UID_BASE + (os.getpid() % 1000) * 1000 + next(_uids) % 1000


class SandboxError(Exception):
    """The sandbox itself failed (start, reset, protocol): an infrastructure error, never the program's."""


class ProcessBackend:
    name = "process"

    def __init__(self, *, layers: LayerCache | None = None):
        self.layers = layers or LayerCache()

    def start(self, image: SandboxImage) -> "ProcessSandbox":
        return ProcessSandbox(image, layer_dir=self.layers.materialize(image))


class ProcessSandbox:
    def __init__(self, image: SandboxImage, *, layer_dir: Path):
        started = time.monotonic()
        self.image = image
        self.id = f"proc-{uuid.uuid4().hex[:10]}"
        self.uid = _next_uid()
        limits = image.limits
        self.cgroup = SandboxCgroup(self.id, memory_mb=limits.memory_mb, max_processes=limits.max_processes)
        self.isolation = ["namespaces:user,pid,ipc,uts,mount" + ("" if limits.network else ",net"),
                          f"uid:{self.uid}", "fs:ro-usr,tmpfs-workdir", "env:clean",
                          "rlimit:cpu,nproc,fsize,nofile,core", *self.cgroup.applied]
        if "cgroup:memory" not in self.cgroup.applied:
            self.isolation.append("rlimit:as")
        command = self._bwrap_command(limits, layer_dir)
        try:
            self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                            stderr=subprocess.DEVNULL, preexec_fn=self._enter, close_fds=True)
        except OSError as exc:
            self.cgroup.kill_all()
            raise SandboxError(f"could not start bubblewrap: {exc}") from exc
        self.channel = Channel(self.process.stdin.fileno(), self.process.stdout.fileno())
        self._expect("ready", START_TIMEOUT, "start")
        self.assembly_seconds = time.monotonic() - started
        self.runs = 0

    def _enter(self) -> None:
        """In the child, before exec: into the cgroups (as root), then drop to the sandbox's uid for good."""
        self.cgroup.join()
        os.setgroups([])
        os.setgid(self.uid)
        os.setuid(self.uid)

    def _bwrap_command(self, limits: Limits, layer_dir: Path) -> list[str]:
        disk = str(limits.disk_mb * 1024 * 1024)
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/sandbox", "LANG": "C.UTF-8",
               "PYTHONPATH": "/image/site", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1"}
        command = ["bwrap", "--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent", "--new-session"]
        if limits.network:
            command.append("--share-net")
        command += ["--ro-bind", "/usr", "/usr", "--symlink", "usr/bin", "/bin", "--symlink", "usr/lib", "/lib",
                    "--symlink", "usr/lib64", "/lib64", "--symlink", "usr/sbin", "/sbin",
                    "--ro-bind", str(layer_dir), "/image", "--proc", "/proc", "--dev", "/dev",
                    "--size", disk, "--tmpfs", "/sandbox", "--size", disk, "--tmpfs", "/tmp",
                    "--size", disk, "--tmpfs", "/dev/shm", "--chdir", "/sandbox", "--hostname", "sandbox",
                    "--uid", str(self.uid), "--gid", str(self.uid), "--clearenv"]
        for name, value in env.items():
            command += ["--setenv", name, value]
        import json

        return command + ["--", SANDBOX_PYTHON, "-s", "-B", "-c", ZYGOTE_SOURCE, json.dumps(self.image.python_modules)]

    def _expect(self, op: str, timeout: float, what: str) -> dict:
        try:
            message = self.channel.receive(timeout)
        except (ChannelClosed, ChannelTimeout) as exc:
            self.destroy()
            raise SandboxError(f"sandbox {what} failed: {type(exc).__name__} {exc}") from None
        if message.get("op") != op:
            self.destroy()
            raise SandboxError(f"sandbox {what} failed: {message.get('reason') or message}")
        return message

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def ping(self, timeout: float = 2.0) -> bool:
        try:
            self.channel.send({"op": "ping"})
            return self.channel.receive(timeout).get("op") == "pong"
        except (ChannelClosed, ChannelTimeout):
            return False

    def reset(self) -> None:
        """Back to the image's clean state, or SandboxError (and the sandbox is destroyed)."""
        try:
            self.channel.send({"op": "reset"})
        except ChannelClosed as exc:
            self.destroy()
            raise SandboxError(f"sandbox reset failed: {exc}") from None
        self._expect("ready", START_TIMEOUT, "reset")

    def run(self, execution: Execution) -> ExecutionResult:
        limits = execution.limits or self.image.limits
        files = dict(execution.files)
        if execution.program is not None:
            files["main.py"] = execution.program.encode()
        request = {
            "op": "run", "command": execution.command, "collect": execution.collect,
            "files": {name: base64.b64encode(content).decode() for name, content in files.items()},
            "stdin": base64.b64encode(execution.stdin).decode(),
            "limits": {"cpu_seconds": limits.cpu_seconds, "wall_seconds": limits.wall_seconds,
                       "max_processes": limits.max_processes, "max_file_bytes": limits.max_file_mb * 1024 * 1024,
                       "open_files": limits.open_files, "output_bytes": limits.output_bytes,
                       "output_hard_bytes": limits.output_hard_bytes,
                       "address_space_bytes": 0 if self.cgroup.memory else limits.memory_mb * 4 * 1024 * 1024},
        }
        self.runs += 1
        oom_before = self.cgroup.oom_kills()
        self.cgroup.reset_peak()
        started = time.monotonic()
        try:
            self.channel.send(request)
            message = self._await_result(started + limits.wall_seconds + WALL_GRACE)
        except ChannelClosed:
            self.destroy()
            return self._result(Status.KILLED, started, "the program killed its own sandbox")
        except ChannelTimeout as timeout:
            self.destroy()
            if str(timeout) == "wall":
                return self._result(Status.TIMEOUT, started, f"ran past the {limits.wall_seconds:g} s wall-clock "
                                                             "limit and was stopped from outside")
            return self._result(Status.KILLED, started, "the sandbox stopped answering (no heartbeat)")
        result = ExecutionResult(
            status=Status(message["status"]), exit_code=message.get("exit_code"), signal=message.get("signal"),
            stdout=base64.b64decode(message.get("stdout", "")), stderr=base64.b64decode(message.get("stderr", "")),
            stdout_truncated=message.get("stdout_truncated", False),
            stderr_truncated=message.get("stderr_truncated", False),
            wall_seconds=message.get("wall_seconds", time.monotonic() - started),
            cpu_seconds=message.get("cpu_seconds", 0.0), peak_memory_mb=message.get("peak_memory_mb", 0.0),
            files={name: base64.b64decode(data) for name, data in message.get("files", {}).items()},
            missing_files=message.get("missing_files", []), reason=message.get("reason", ""),
            isolation=self.isolation, backend="process", sandbox_id=self.id,
        )
        if self.cgroup.oom_kills() > oom_before and result.status != Status.OK:
            result.status = Status.KILLED
            result.reason = f"ran out of its {limits.memory_mb} MB of memory"
        return result

    def _await_result(self, hard_deadline: float) -> dict:
        while True:
            remaining = hard_deadline - time.monotonic()
            if remaining <= 0:
                raise ChannelTimeout("wall")
            try:
                message = self.channel.receive(min(HEARTBEAT_TIMEOUT, remaining))
            except ChannelTimeout:
                if time.monotonic() >= hard_deadline:
                    raise ChannelTimeout("wall") from None
                raise ChannelTimeout("heartbeat") from None
            if message.get("op") != "heartbeat":
                return message

    def _result(self, status: Status, started: float, reason: str) -> ExecutionResult:
        return ExecutionResult(status=status, reason=reason, wall_seconds=time.monotonic() - started,
                               isolation=self.isolation, backend="process", sandbox_id=self.id)

    def destroy(self) -> None:
        if self.process.poll() is None:
            self.process.kill()  # bwrap's --die-with-parent takes the namespace's init, and so everything, down
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        self.cgroup.kill_all()
        for stream in (self.process.stdin, self.process.stdout):
            try:
                stream.close()
            except OSError:
                pass

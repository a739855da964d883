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

import itertools
import json
import os
import subprocess
import threading
import time
import uuid
from pathlib import Path

from .cgroups import SandboxCgroup, reap_orphans
from .layers import LayerCache
from .protocol import Channel
from .types import Limits, SandboxImage, refuse_network
from .zygote_client import START_TIMEOUT, SandboxError, ZygoteSandbox

ZYGOTE_SOURCE = (Path(__file__).parent / "zygote.py").read_text()
SANDBOX_PYTHON = "/usr/bin/python3"
# How a sandbox enters its cgroups and drops to its uid before bubblewrap runs: a shell writes its pid into each
# group's cgroup.procs (the paths it is given after their count), then util-linux's setpriv sets the uid and gid
# (real, effective and saved) and clears the groups, and execs bubblewrap. Done in Python (a Popen preexec_fn, or
# its user= and group=) it would make CPython fork the whole studio process instead of vfork: the page tables of
# a trainer's gigabytes copied at every start, and every page it writes afterwards faulted once more, copy-on-write.
# In `bench pipeline` a pool starting ~37 sandboxes a step kept the trainer's process as long in the kernel as in its
# own code.
# The shell's own PWD (the studio's directory) is unset: bubblewrap's environment is readable inside.
ENTER_THEN_EXEC = 'unset PWD OLDPWD; n=$1; shift; while [ "$n" -gt 0 ]; do echo $$ > "$1" || exit 126; shift; ' \
                  'n=$((n - 1)); done; exec "$@"'
UID_BASE = 200_000  # sandbox uids: far from any account on the machine, one per live sandbox

_uids = itertools.count()
_uid_lock = threading.Lock()


def own_uid_range() -> range:
    """The uids this process hands to its sandboxes: 1,000 per process, so pools of different processes never
    share a uid (and so never share an RLIMIT_NPROC count)."""
    start = UID_BASE + (os.getpid() % 1000) * 1000
    return range(start, start + 1000)


def _next_uid() -> int:
    with _uid_lock:
        return own_uid_range()[next(_uids) % 1000]


class ProcessBackend:
    name = "process"

    def __init__(self, *, layers: LayerCache | None = None, network_allowed: bool = False):
        """network_allowed: whether an image may have the host's network (limits.network); the operator's
        choice (STUDIO_SANDBOX_NETWORK), refused otherwise (types.refuse_network)."""
        self.layers = layers or LayerCache()
        self.network_allowed = network_allowed
        reap_orphans()  # what a worker killed outright left: its sandboxes died with it, their cgroups did not

    def start(self, image: SandboxImage) -> "ProcessSandbox":
        refuse_network(image, allowed=self.network_allowed)
        return ProcessSandbox(image, layer_dir=self.layers.materialize(image))


class ProcessSandbox(ZygoteSandbox):
    backend_name = "process"

    def __init__(self, image: SandboxImage, *, layer_dir: Path):
        started = time.monotonic()
        self.image = image
        self.id = f"proc-{uuid.uuid4().hex[:10]}"
        self.uid = _next_uid()
        limits = image.limits
        # Named after this process too, so that the groups of a worker killed outright can be told and reaped.
        self.cgroup = SandboxCgroup(f"{os.getpid()}-{self.id}", memory_mb=limits.memory_mb,
                                    max_processes=limits.max_processes, cpus=limits.cpus)
        self.isolation = ["namespaces:user,pid,ipc,uts,mount" + ("" if limits.network else ",net"),
                          f"uid:{self.uid}", "fs:ro-usr,tmpfs-workdir", "env:clean",
                          "rlimit:cpu,nproc,fsize,nofile,core", *self.cgroup.applied]
        if "cgroup:memory" not in self.cgroup.applied:
            self.isolation.append("rlimit:as")
        procs = [str(group / "cgroup.procs") for group in self.cgroup.groups]
        command = ["/bin/sh", "-c", ENTER_THEN_EXEC, "sh", str(len(procs)), *procs,
                   "setpriv", f"--reuid={self.uid}", f"--regid={self.uid}", "--clear-groups", "--",
                   *self._bwrap_command(limits, layer_dir)]
        try:
            # bubblewrap's own environment is empty too: its init stays in the sandbox as pid 1, and the program
            # could read /proc/1/environ.
            self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                            stderr=subprocess.DEVNULL, close_fds=True, env={"PATH": "/usr/bin:/bin"})
        except OSError as exc:
            self.cgroup.kill_all()
            raise SandboxError(f"could not start bubblewrap: {exc}") from exc
        self.channel = Channel(self.process.stdin.fileno(), self.process.stdout.fileno())
        self.memory_limited = self.cgroup.memory is not None
        self._expect("ready", START_TIMEOUT, "start")
        self.assembly_seconds = time.monotonic() - started

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
        return command + ["--", SANDBOX_PYTHON, "-s", "-B", "-c", ZYGOTE_SOURCE, json.dumps(self.image.python_modules)]

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def oom_kills(self) -> int:
        return self.cgroup.oom_kills()

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

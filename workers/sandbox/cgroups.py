"""Per-sandbox cgroups (v1 memory, pids and cpu controllers, as these machines mount them).

They bound the sandbox as a whole — the warm interpreter and everything the program starts — and tell an
out-of-memory kill apart from other deaths. Where they cannot be created (not root, other layouts) the
sandbox still runs, with rlimits only, and says so in the result's `isolation`.
"""

import os
import signal
import time
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")
GROUP = "posttrain-studio"
ZYGOTE_MEMORY_MB = 64  # headroom for the warm interpreter itself


def oom_kill_count(memory_group: Path) -> int:
    """How many processes a v1 memory cgroup's limit has killed (0 where the group cannot be read)."""
    try:
        for line in (memory_group / "memory.oom_control").read_text().splitlines():
            if line.startswith("oom_kill "):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def reap_orphans() -> int:
    """Removes the groups of sandboxes whose studio process is gone (named `<its pid>-<sandbox id>`): a worker killed
    outright leaves its groups behind, their processes already dead with the sandbox. Returns how many went."""
    removed = 0
    for controller in ("memory", "pids", "cpu"):
        root = ROOT / controller / GROUP
        try:
            names = os.listdir(root)
        except OSError:
            continue
        for name in names:
            owner = name.split("-", 1)[0]
            if not owner.isdigit() or process_alive(int(owner)):
                continue
            group = root / name
            try:
                for pid in (group / "cgroup.procs").read_text().split():
                    os.kill(int(pid), signal.SIGKILL)
                group.rmdir()
                removed += 1
            except OSError:
                pass  # still emptying: the next start tries again
    return removed


class SandboxCgroup:
    def __init__(self, name: str, *, memory_mb: int, max_processes: int, cpus: float):
        self.memory = ROOT / "memory" / GROUP / name
        self.pids = ROOT / "pids" / GROUP / name
        self.cpu = ROOT / "cpu" / GROUP / name
        self.applied: list[str] = []
        try:
            self.memory.mkdir(parents=True, exist_ok=True)
            limit = str((memory_mb + ZYGOTE_MEMORY_MB) * 1024 * 1024)
            (self.memory / "memory.limit_in_bytes").write_text(limit)
            swap = self.memory / "memory.memsw.limit_in_bytes"
            if swap.exists():
                swap.write_text(limit)  # no escape into swap
            self.applied.append("cgroup:memory")
        except OSError:
            self.memory = None
        try:
            self.pids.mkdir(parents=True, exist_ok=True)
            (self.pids / "pids.max").write_text(str(max_processes + 4))
            self.applied.append("cgroup:pids")
        except OSError:
            self.pids = None
        try:
            self.cpu.mkdir(parents=True, exist_ok=True)
            period = int((self.cpu / "cpu.cfs_period_us").read_text())
            (self.cpu / "cpu.cfs_quota_us").write_text(str(max(1000, int(cpus * period))))
            self.applied.append("cgroup:cpu")
        except OSError:
            self.cpu = None

    @property
    def groups(self) -> list[Path]:
        """The groups made for the sandbox, which its first process joins before bubblewrap runs (process.py)."""
        return [group for group in (self.memory, self.pids, self.cpu) if group is not None]

    def oom_kills(self) -> int:
        return oom_kill_count(self.memory) if self.memory is not None else 0

    def kill_all(self) -> None:
        """SIGKILL whatever is still inside, then remove the groups."""
        for group in (self.pids, self.memory, self.cpu):
            if group is None or not group.exists():
                continue
            for _ in range(50):
                pids = [int(p) for p in (group / "cgroup.procs").read_text().split()]
                if not pids:
                    break
                for pid in pids:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                time.sleep(0.01)
            try:
                group.rmdir()
            except OSError:
                pass

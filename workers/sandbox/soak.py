"""A soak run: honest and hostile programs mixed, at a given concurrency, for a given time; then the ledger of
what leaked (processes of sandbox uids, this process's descriptors, temporary directories). Not a CI test:
`manage.py sandbox soak --minutes 10 --concurrency 4`."""

import os
import random
import threading
import time
from collections import Counter
from pathlib import Path

from .pool import SandboxPool
from .types import Execution, Limits, SandboxImage

PROGRAMS = {
    "honest: arithmetic": "print(sum(range(10**5)))",
    "honest: files": "open('a.txt', 'w').write('x' * 1000)\nprint(len(open('a.txt').read()))",
    "honest: subprocess": "import subprocess\nprint(subprocess.run(['echo', 'hi'], capture_output=True).stdout)",
    "honest: error": "raise ValueError('expected')",
    "hostile: infinite loop": "while True: pass",
    "hostile: fork bomb": "import os\nwhile True:\n    try: os.fork()\n    except OSError: pass",
    "hostile: memory bomb": "x = []\nwhile True: x.append(bytearray(8 << 20))",
    "hostile: output flood": "import sys\nwhile True: sys.stdout.write('y' * 65536)",
    "hostile: detached sleeper": "import os, time\nif os.fork() == 0:\n    os.setsid()\n"
                                 "    time.sleep(10**6)\nprint(1)",
    "hostile: kill parent": "import os\nos.kill(os.getppid(), 9)",
    "hostile: disk fill": "f = open('fill', 'wb')\nwhile True: f.write(b'x' * (1 << 20))",
}
SOAK_IMAGE = SandboxImage(key="soak/python@1", layers=({"type": "base", "image": "python-3.11"},),
                          limits=Limits(cpu_seconds=2, wall_seconds=3, memory_mb=128, max_processes=32, disk_mb=16,
                                        output_bytes=4096, output_hard_bytes=1 << 20), warm_pool_size=4)


def uid_process_counts(uids: range) -> dict[int, int]:
    """uid -> live processes (zombies aside) for the uids in `uids`."""
    counts: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                uid = entry.stat().st_uid
                state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            except (FileNotFoundError, ProcessLookupError):
                continue
            if uid in uids and state != "Z":
                counts[uid] = counts.get(uid, 0) + 1
    return counts


def _temporary_entries(backend) -> set[str]:
    """What the sandbox machinery could leave behind: temp folders in /tmp and /var/tmp, half-built layers
    (finished ones are named by their 64-hex hash), docker control directories. Other programs' files in /tmp
    are not ours to count."""
    entries = {f"/tmp/{name}" for name in os.listdir("/tmp") if name.startswith(("tmp", "posttrain", "studio"))}
    layer_root = backend.layers.root if hasattr(backend, "layers") else None
    for folder in filter(None, (layer_root, getattr(backend, "control_root", None))):
        if folder.exists():
            entries |= {str(path) for path in folder.iterdir() if not (folder == layer_root and len(path.name) == 64)}
    return entries


def soak(*, backend, minutes: float, concurrency: int, seed: int = 0, progress=None) -> dict:
    from .process import own_uid_range

    temp_before = _temporary_entries(backend)
    fds_before = len(os.listdir("/proc/self/fd"))
    pool = SandboxPool(backend)
    pool.warm(SOAK_IMAGE)
    deadline = time.monotonic() + minutes * 60
    outcomes: Counter = Counter()
    lock = threading.Lock()

    def worker(index: int) -> None:
        rng = random.Random(seed * 1000 + index)
        names = sorted(PROGRAMS)
        while time.monotonic() < deadline:
            name = rng.choice(names)
            result = pool.execute(SOAK_IMAGE, Execution(program=PROGRAMS[name]))
            with lock:
                outcomes[f"{name} -> {result.status}"] += 1
                if progress:
                    progress(sum(outcomes.values()))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(concurrency)]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.monotonic() - started
    pool.close()
    time.sleep(0.5)
    return {
        "minutes": round(elapsed / 60, 2), "concurrency": concurrency, "executions": sum(outcomes.values()),
        "executions_per_second": round(sum(outcomes.values()) / elapsed, 1), "outcomes": dict(sorted(outcomes.items())),
        "leaked_processes": sum(uid_process_counts(own_uid_range()).values()),
        "leaked_file_descriptors": len(os.listdir("/proc/self/fd")) - fds_before,
        "leaked_temporary_entries": sorted(_temporary_entries(backend) - temp_before),
    }

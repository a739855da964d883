"""Hostile programs: each gets the right status, the caller and the pool survive, no process is left
behind, and nothing outside the sandbox changes."""

import os
import socket
import threading
from pathlib import Path

import pytest

from tests.support import ROOT
from tests.support.sandbox import HOSTILE_IMAGE, IDLE_PROCESSES, sandbox_process_counts, settle
from workers.sandbox import Execution, Status
from workers.sandbox.docker import DockerBackend

HOST_CANARIES = [Path("/tmp/posttrain-canary"), Path("/dev/shm/posttrain-canary"), Path.home() / "posttrain-canary"]
SECRET = "sk-host-secret-4d1c"


@pytest.fixture(autouse=True)
def host_unchanged(pool):
    """Around every test: no canary appears on the host, the warm sandboxes are the only sandbox processes,
    and this process leaks no file descriptors."""
    for canary in HOST_CANARIES:
        canary.unlink(missing_ok=True)
    # The first test's count is the baseline for the module: a leak of one descriptor a run adds up and fails.
    baseline = pool.__dict__.setdefault("test_fd_baseline", own_descriptors(pool, settle(pool)))
    yield
    state = settle(pool)
    for canary in HOST_CANARIES:
        assert not canary.exists(), f"the sandbox wrote {canary} on the host"
    counts = sandbox_process_counts(pool)
    assert counts and all(n == IDLE_PROCESSES[pool.backend.name] for n in counts.values()), counts
    slack = {"process": 0, "docker": DockerBackend.API_CONNECTIONS}[pool.backend.name]  # the SDK's own pool
    assert own_descriptors(pool, state) <= baseline + slack


def own_descriptors(pool, state) -> int:
    """This process's open descriptors, less those each warm sandbox holds (two pipes, or one unix socket)."""
    per_sandbox = {"process": 2, "docker": 1}[pool.backend.name]
    return len(os.listdir("/proc/self/fd")) - per_sandbox * state["warm"]


def run(pool, program: str, **kwargs):
    result = pool.execute(HOSTILE_IMAGE, Execution(program=program, **kwargs))
    assert result.status != Status.INFRA_ERROR, result.reason  # hostility is never the infrastructure's fault
    return result


def still_works(pool):
    result = run(pool, "print(6 * 7)")
    assert result.status == Status.OK and result.stdout == b"42\n"


HOSTILE = {
    "infinite loop": ("while True: pass", {Status.TIMEOUT}),
    "sleep forever": ("import time; time.sleep(10**6)", {Status.TIMEOUT}),
    "fork bomb": ("import os\nwhile True:\n    try: os.fork()\n    except OSError: pass", {Status.TIMEOUT}),
    "thread bomb": ("import threading, time\nwhile True: threading.Thread(target=time.sleep, args=(99,)).start()",
                    {Status.ERROR, Status.TIMEOUT}),
    "memory bomb": ("chunks = []\nwhile True: chunks.append(bytearray(16 * 1024 * 1024))",
                    {Status.KILLED, Status.ERROR}),
    "disk fill": ("with open('fill', 'wb') as f:\n    while True: f.write(b'x' * 1048576)",
                  {Status.ERROR, Status.KILLED}),
    "many small files": ("i = 0\nwhile True:\n    with open(f'f{i}', 'w') as f: f.write('x' * 4096)\n    i += 1",
                         {Status.ERROR}),
    "2 GB of output": ("import sys\nblock = b'y' * 1048576\nfor _ in range(2048): sys.stdout.buffer.write(block)",
                       {Status.KILLED}),
    "output on stderr": ("import sys\nwhile True: sys.stderr.write('e' * 65536)", {Status.KILLED}),
    "ignore signals": ("import signal, time\nfor s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):\n"
                       "    signal.signal(s, signal.SIG_IGN)\nwhile True: time.sleep(0.01)", {Status.TIMEOUT}),
    "close stdout and hang": ("import os, time\nos.close(1)\nos.close(2)\ntime.sleep(10**6)", {Status.TIMEOUT}),
    "segfault": ("import ctypes\nctypes.string_at(0)", {Status.ERROR}),
    "abort": ("import os\nos.abort()", {Status.ERROR}),
    "kill its parent": ("import os\nos.kill(os.getppid(), 9)", {Status.KILLED}),
    "kill everything it can": ("import os\nos.kill(-1, 9)", {Status.KILLED}),
    "stop its parent": ("import os, signal\nos.kill(os.getppid(), signal.SIGSTOP)\nimport time; time.sleep(10)",
                        {Status.KILLED, Status.TIMEOUT}),
    "ptrace its parent": ("import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
                          "assert libc.ptrace(16, os.getppid(), 0, 0) != 0, 'attached'\n"
                          "open(f'/proc/{os.getppid()}/mem', 'rb')", {Status.ERROR}),
    "raise file limits": ("import resource\nresource.setrlimit(resource.RLIMIT_NOFILE, (10**6, 10**6))",
                          {Status.ERROR}),
    "exhaust file descriptors": ("fs = []\nwhile True: fs.append(open('/dev/null'))", {Status.ERROR}),
    "nested user namespace": ("import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
                              "assert libc.unshare(0x10000000) != 0, 'unshared'\nraise SystemExit(3)", {Status.ERROR}),
    "mount": ("import subprocess\nraise SystemExit(subprocess.call(['mount', '-t', 'tmpfs', 'x', '/usr']))",
              {Status.ERROR}),
    "write /usr": ("open('/usr/evil', 'w')", {Status.ERROR}),
    "write the image": ("open('/image/evil', 'w')", {Status.ERROR}),
    "sys.exit with a message": ("import sys\nsys.exit('refusing')", {Status.ERROR}),
    "os._exit before anything": ("import os\nos._exit(0)", {Status.OK}),
    "detached grandchild": ("import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
                            "        time.sleep(10**6)\n    os._exit(0)\ntime.sleep(0.2)\nprint('parent done')",
                            {Status.OK}),
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_program_is_contained(pool, name):
    program, expected = HOSTILE[name]
    result = run(pool, program)
    assert result.status in expected, (name, result.status, result.reason, result.stderr[-500:])
    assert result.wall_seconds < HOSTILE_IMAGE.limits.wall_seconds + 4
    still_works(pool)


def test_output_is_capped_with_a_truncation_flag(pool):
    result = run(pool, "print('z' * 100000)")
    assert result.status == Status.OK and result.stdout_truncated
    assert len(result.stdout) == HOSTILE_IMAGE.limits.output_bytes


def test_reads_no_host_secret_environment(pool, monkeypatch):
    monkeypatch.setenv("STUDIO_TEST_SECRET", SECRET)
    result = run(pool, "import os, glob\nprint(dict(os.environ))\nfor p in glob.glob('/proc/*/environ'):\n"
                       "    try: print(open(p, 'rb').read())\n    except OSError as e: print(p, e)")
    assert result.status == Status.OK
    assert SECRET.encode() not in result.stdout
    # Nothing of this process's environment either (it was there when the pool's sandboxes started).
    leaked = [name for name, value in os.environ.items() if len(value) >= 8 and value.encode() in result.stdout]
    assert leaked == [] and b"DATABASE_URL" not in result.stdout
    assert set(eval(result.stdout.splitlines()[0])) <= {"PATH", "HOME", "LANG", "PYTHONPATH", "PWD", "HOSTNAME",
                                                         "PYTHONDONTWRITEBYTECODE", "PYTHONUNBUFFERED"}


@pytest.mark.parametrize("path", ["/etc/shadow", str(Path(__file__).resolve()),
                                  str(ROOT / "studio" / "settings.py"),
                                  "/root/.bashrc", "/var/lib/postgresql", "/work"])
def test_host_files_are_out_of_sight(pool, path):
    result = run(pool, f"import os\nprint(os.path.exists({path!r}))\nopen({path!r}).read()")
    assert result.status == Status.ERROR and result.stdout == b"False\n"


def test_the_hosts_account_list_is_not_the_one_inside(pool):
    result = run(pool, "import os\nprint(open('/etc/passwd').read() if os.path.exists('/etc/passwd') else '')")
    assert result.status == Status.OK and result.stdout.strip() != Path("/etc/passwd").read_bytes().strip()


def test_the_database_file_is_out_of_sight(pool, settings):
    from django.db import connection

    name = str(connection.settings_dict["NAME"])
    result = run(pool, f"import os\nprint(os.path.exists({name!r}))")
    assert result.stdout == b"False\n"


def test_writes_stay_inside_the_sandbox(pool):
    result = run(pool, "from pathlib import Path\nfor p in ['/tmp/posttrain-canary', '/dev/shm/posttrain-canary',"
                       " '/sandbox/posttrain-canary']:\n    Path(p).write_text('x')\n"
                       f"open({str(Path.home() / 'posttrain-canary')!r}, 'w')")
    assert result.status == Status.ERROR  # the host's home is not there; the three sandbox writes were fine
    assert b"No such file or directory" in result.stderr


def test_no_network_even_to_this_machine(pool):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    accepted = []
    threading.Thread(target=lambda: accepted.append(server.accept()), daemon=True).start()
    result = run(pool, f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1)")
    server.close()
    assert result.status == Status.ERROR and b"Connection refused" in result.stderr
    assert accepted == []


def test_collected_files_never_follow_symlinks_out(pool):
    result = run(pool, "import os\nos.symlink('/etc/hostname', 'out.txt')\nos.mkfifo('pipe')\n"
                       "open('real.txt', 'w').write('mine')", collect=["out.txt", "pipe", "real.txt", "../x"])
    assert result.status == Status.OK
    assert result.files == {"real.txt": b"mine"} and set(result.missing_files) == {"out.txt", "pipe", "../x"}


def test_a_reset_leaves_nothing_for_the_next_trajectory(pool):
    dirty = run(pool, "import os\nos.makedirs('locked/inner')\nopen('locked/inner/f', 'w').write('x')\n"
                      "os.chmod('locked/inner', 0)\nos.chmod('locked', 0)\nopen('/tmp/left', 'w').write('x')\n"
                      "open('/dev/shm/left', 'w').write('x')")
    assert dirty.status == Status.OK
    for _ in range(3):  # whichever warm sandbox we get next, it is clean
        seen = run(pool, "import os\nprint(sorted(os.listdir('.')), os.listdir('/tmp'), os.listdir('/dev/shm'))")
        assert seen.stdout == b"['main.py'] [] []\n"


def test_binary_garbage_output_comes_back_as_bytes(pool):
    result = run(pool, "import os, sys\nsys.stdout.buffer.write(bytes(range(256)) * 4)")
    assert result.status == Status.OK and result.stdout == bytes(range(256)) * 4

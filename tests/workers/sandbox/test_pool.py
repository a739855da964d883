"""SandboxPool behaviour: warm hand-out, replacement of dead sandboxes, what the pool grew by kept while in use,
reclaimed sessions, bounded retries."""

import subprocess
import sys
import time

import pytest

from tests.support import ROOT
from tests.support.sandbox import HOSTILE_IMAGE, IDLE_PROCESSES, TIGHT, sandbox_processes, settle
from workers.sandbox import AcquireTimeout, Execution, LeaseExpired, SandboxImage, SandboxPool, Status
from workers.sandbox.process import ProcessBackend
from workers.sandbox.soak import uid_process_counts

pytestmark = pytest.mark.sandbox

SMALL = SandboxImage(key="test/small@1", layers=HOSTILE_IMAGE.layers, limits=TIGHT, warm_pool_size=1)


@pytest.fixture
def fresh_pool(layer_cache):
    pools = []

    def make(**options):
        pool = SandboxPool(ProcessBackend(layers=layer_cache), **options)
        pools.append(pool)
        return pool

    yield make
    for pool in pools:
        pool.close()


def test_a_session_keeps_its_files_between_runs_and_the_next_lease_starts_clean(fresh_pool):
    pool = fresh_pool()
    pool.warm(SMALL)
    with pool.acquire(SMALL) as lease:
        assert lease.run(Execution(program="open('notes.txt', 'w').write('step 1')")).status == Status.OK
        second = lease.run(Execution(program="print(open('notes.txt').read())"))
        assert second.stdout == b"step 1\n"
    with pool.acquire(SMALL) as lease:
        assert lease.run(Execution(program="import os; print(os.path.exists('notes.txt'))")).stdout == b"False\n"


def test_dead_sandboxes_are_replaced_and_the_pool_stays_warm(fresh_pool):
    pool = fresh_pool()
    pool.warm(SMALL, 2)
    settle(pool, SMALL)
    killed = pool.execute(SMALL, Execution(program="import os; os.kill(os.getppid(), 9)"))
    assert killed.status == Status.KILLED
    state = settle(pool, SMALL)
    assert state["warm"] == 2 and state["environment_assembly"]["count"] == 3


def test_leases_one_after_another_start_one_sandbox_and_what_the_pool_grew_by_goes_once_unused(fresh_pool):
    """A lease taken from the warm sandbox starts another (the warm size is kept idle); the leased one, reset, is
    kept for the next lease instead of a third start, and let go `surplus_seconds` after the last acquire."""
    pool = fresh_pool(surplus_seconds=2.0)
    pool.warm(SMALL, 1)
    settle(pool, SMALL)
    for _ in range(4):
        with pool.acquire(SMALL) as lease:
            assert lease.run(Execution(program="print(1)")).status == Status.OK
        state = settle(pool, SMALL)
        assert state["warm"] == 2 and state["environment_assembly"]["count"] == 2, state
    deadline = time.monotonic() + 10
    while settle(pool, SMALL)["warm"] != 1 and time.monotonic() < deadline:
        time.sleep(0.1)
    state = settle(pool, SMALL)
    assert state["warm"] == 1 and state["environment_assembly"]["count"] == 2, state


def test_acquire_gives_up_at_its_deadline_when_every_sandbox_is_busy(fresh_pool):
    pool = fresh_pool(ceiling_factor=1)
    pool.warm(SMALL, 1)
    with pool.acquire(SMALL):
        started = time.monotonic()
        with pytest.raises(AcquireTimeout, match="became free within 0.3 s"):
            pool.acquire(SMALL, timeout=0.3)
        assert 0.25 < time.monotonic() - started < 2


def test_an_idle_session_is_reclaimed(fresh_pool):
    pool = fresh_pool(lease_idle_timeout=0.3)
    pool.warm(SMALL, 1)
    lease = pool.acquire(SMALL)
    time.sleep(1.0)
    with pytest.raises(LeaseExpired):
        lease.run(Execution(program="print(1)"))
    lease.release()  # harmless after a reclaim
    assert settle(pool, SMALL)["warm"] == 1


def test_an_image_that_cannot_start_is_an_infra_error_after_bounded_retries(fresh_pool):
    pool = fresh_pool(max_start_failures=2)
    broken = SandboxImage(key="test/broken@1", layers=({"type": "base", "image": "windows-11"},), limits=TIGHT)
    result = pool.execute(broken, Execution(program="print(1)"), timeout=5, retries=2)
    assert result.status == Status.INFRA_ERROR
    assert "process backend runs this machine's Python 3.11" in result.reason
    assert pool.status()[0]["failed_starts"] == 2


def test_a_failing_program_is_never_retried(fresh_pool):
    pool = fresh_pool()
    result = pool.execute(SMALL, Execution(program="raise SystemExit(4)"), retries=5)
    assert result.status == Status.ERROR and result.exit_code == 4 and result.attempts == 1


def test_commands_run_too_with_stdin_and_output_files(fresh_pool):
    pool = fresh_pool()
    result = pool.execute(SMALL, Execution(command=["/bin/sh", "-c", "tr a-z A-Z > out.txt; echo done"],
                                           stdin=b"shout", collect=["out.txt"]))
    assert result.status == Status.OK and result.stdout == b"done\n" and result.files == {"out.txt": b"SHOUT"}


def test_closing_the_pool_leaves_no_process(fresh_pool):
    pool = fresh_pool()
    pool.warm(SMALL, 3)
    settle(pool, SMALL)
    lease = pool.acquire(SMALL)
    uid = lease.sandbox.uid
    assert sandbox_processes().get(uid) == IDLE_PROCESSES["process"]
    pool.close()
    assert uid not in sandbox_processes()


# The interpreter exiting under a pool in use, as the embedded studio's does when it is stopped mid-run: the
# executors refuse new jobs (concurrent.futures' exit hook) while the maintenance thread pings and a trajectory
# releases its lease. The maintenance thread once died there ("cannot schedule new futures after interpreter
# shutdown"); now the pool starts nothing more, destroys what it can no longer reset, and the process exits.
EXITING_POOL = """
import sys, threading, time
from tests.support.sandbox import HOSTILE_IMAGE as IMAGE, reachable_cache, remove_cache
from workers.sandbox import Execution, SandboxPool
from workers.sandbox.process import ProcessBackend, own_uid_range

cache = reachable_cache()
pool = SandboxPool(ProcessBackend(layers=cache), heartbeat_interval=0.1)
pool.warm(IMAGE, 2)
lease = pool.acquire(IMAGE, timeout=20)
assert lease.run(Execution(program="print(1)")).stdout == b"1\\n"

def release_during_exit():
    time.sleep(1.0)  # the main thread has returned: concurrent.futures refuses new work by now
    lease.release()
    time.sleep(0.5)  # the maintenance thread pings a few more times
    pool.close()
    remove_cache(cache)

threading.Thread(target=release_during_exit).start()  # not a daemon: the interpreter waits for it
print(own_uid_range().start, flush=True)
"""


def test_a_pool_in_use_while_the_interpreter_exits_releases_its_sandboxes_and_the_process_ends(layer_cache):
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", EXITING_POOL], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Exception in thread" not in done.stderr and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert time.monotonic() - started < 30
    first_uid = int(done.stdout.split()[0])
    assert uid_process_counts(range(first_uid, first_uid + 1000)) == {}

"""A sandbox that stops answering before it runs anything (its processes frozen: a host under pressure, a hung
backend) is the infrastructure's fault: the run is retried in a fresh sandbox, and where retries run out the
result is an infrastructure error — never a timeout or a kill charged to the program, so never a score. A
sandbox that goes quiet while the program runs is still the program's doing (test_hostile: "stop its parent")."""

import os
import signal

import pytest

from tests.support.sandbox import TIGHT, settle
from workers.definitions.specs import parse_spec
from workers.sandbox import Execution, SandboxImage, SandboxPool, Status
from workers.sandbox.process import ProcessBackend, own_uid_range
from workers.sandbox.soak import uid_process_counts
from workers.verifiers import Context, Item, Sample, verify

pytestmark = pytest.mark.sandbox

ONE = SandboxImage(key="test/one@1", layers=({"type": "base", "image": "python-3.11"},), limits=TIGHT,
                   warm_pool_size=1)
GRADER = parse_spec("verifier", {"layers": [{"name": "env", "kind": "environment", "checks": [
    {"type": "python_grader", "name": "grader", "timeout_seconds": 10,
     "source": "def grade(sample, item):\n    return 1.0\n"}]}]})


@pytest.fixture
def pool(layer_cache):
    # No idle pings during the test: the frozen sandbox must be found by the run, not by the maintenance thread.
    pool = SandboxPool(ProcessBackend(layers=layer_cache), heartbeat_interval=3600)
    pool.warm(ONE)
    settle(pool, ONE)
    yield pool
    pool.close()


def freeze_idle_sandboxes() -> list[int]:
    """SIGSTOP every process of this test's sandbox uids (the idle sandbox's init, zygote and spare)."""
    uids = set(uid_process_counts(own_uid_range()))
    frozen = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                uid = os.stat(f"/proc/{entry}").st_uid
            except FileNotFoundError:
                continue
            if uid in uids:
                os.kill(int(entry), signal.SIGSTOP)
                frozen.append(int(entry))
    assert frozen, "no sandbox process to freeze"
    return frozen


def test_a_frozen_sandbox_is_an_infrastructure_error_and_the_run_goes_to_a_fresh_one(pool):
    freeze_idle_sandboxes()
    with pool.acquire(ONE) as lease:
        frozen = lease.run(Execution(program="print('never')"))
    assert frozen.status == Status.INFRA_ERROR and "did not answer the run request" in frozen.reason
    retried = pool.execute(ONE, Execution(program="print(6 * 7)"))
    assert retried.status == Status.OK and retried.stdout == b"42\n"


def test_pool_execute_retries_past_a_frozen_sandbox(pool):
    freeze_idle_sandboxes()
    result = pool.execute(ONE, Execution(program="print(6 * 7)"))
    assert result.status == Status.OK and result.stdout == b"42\n" and result.attempts == 2


def test_a_verification_whose_sandbox_froze_is_graded_in_a_fresh_one_not_scored_zero(pool):
    freeze_idle_sandboxes()
    verdict = verify(GRADER, Sample(response="anything"), Item("k", {}, {}), Context(pool=pool, image=ONE))
    assert (verdict.reward, verdict.status) == (1.0, "pass"), verdict.stopped_because

"""The collectors' rules with a fake rollout: no model, no sandbox, no torch.

The fake rollout stamps each trajectory with the policy version current when its group started and sleeps a
random while (some groups are slow); a fake trainer loop takes batches and bumps the version. What is checked is
the collectors' own business: admission never lets more than (max_staleness + 1) × groups_per_step groups be
pending, so nothing trained on is staler than the bound; sync batches come in draw order; a failure anywhere
reaches the trainer; a closed collector stops without errors of its own.
"""

import random
import subprocess
import sys
import threading
import time

import pytest

from workers.rl.config import GRPOConfig
from workers.rl.rollout.collectors import (
    Admission,
    AsyncCollector,
    Draws,
    Group,
    SyncCollector,
    collector_for,
    step_wants_more,
    too_stale,
)
from workers.rl.rollout.idle import PhaseBoard
from workers.rl.tasks.scheduler import Scheduler
from workers.rl.tasks.taskset import TaskSet
from workers.rl.types import TaskTemplate, Trajectory
from workers.sandbox import SandboxImage
from workers.verifiers import Item

RUN_ID = "00000000-0000-4000-8000-0000000000c0"
TEMPLATE = TaskTemplate.from_spec(  # never rolled out nor verified: the fake world stands in for both
    key="task_template/fake@1", domain="fake", image=SandboxImage(key="sandbox_image/none@1", layers=()),
    verifier_key="verifier/fake@1",
    verifier_spec={"layers": [{"name": "exact", "kind": "exact", "checks": [{"type": "string_check"}]}]},
    spec={"prompt_template": "{n}", "sandbox_image": "none@1", "verifier": "fake@1",
          "limits": {"max_turns": 1, "max_tokens": 4, "max_seconds": 10}})
TASKS = TaskSet.single_template(TEMPLATE, {f"t{n}": Item(key=f"t{n}", inputs={"n": n}, hidden={}) for n in range(50)})


def config(**overrides) -> GRPOConfig:
    return GRPOConfig.resolve({"groups_per_step": 3, "group_size": 2, "eval_tasks_per_domain": 0,
                                                  **overrides})


class FakeWorld:
    """A policy version that a fake trainer bumps, and a rollout that records how much was pending."""

    def __init__(self, *, seed: int = 0, slow: float = 0.02, max_staleness: int = 0):
        self.version = 0
        self.max_staleness = max_staleness
        self.too_stale = 0
        self.rng = random.Random(seed)
        self.lock = threading.Lock()
        self.slow = slow
        self.collector = None
        self.max_pending = 0

    def rollout(self, tasks, group_size):
        with self.lock:
            started_at = self.version
            delay = self.rng.random() * self.slow * (10 if self.rng.random() < 0.2 else 1)  # a heavy tail
        if isinstance(self.collector, AsyncCollector):
            with self.collector._cond:
                self.max_pending = max(self.max_pending, self.collector.pending())
        time.sleep(delay)
        return [[Trajectory(id=f"{task.seq}/{sample}", run_id=RUN_ID, seq=task.seq, sample=sample,
                            domain=task.domain, template=task.template.key, task_key=task.item.key, task_hash="",
                            image="", verifier="", policy_version=started_at) for sample in range(group_size)]
                for task in tasks]

    @staticmethod
    def verify(task, trajectory):
        trajectory.reward = float(trajectory.sample % 2)

    def select(self, group, consumed):
        """The pipeline's staleness rule (the rest of its selection needs a trainer): a group that faster ones
        overtook past the bound is consumed, not trained on."""
        consumed.append(group)
        with self.lock:
            if too_stale(group.trajectories, version=self.version, max_staleness=self.max_staleness):
                self.too_stale += 1
                return None
        return group.trajectories


def make(kind, world: FakeWorld, run_config: GRPOConfig, **parts):
    collector = kind(config=run_config, draws=Draws(Scheduler(TASKS.domains, seed=0), TASKS,
                                                    batch=run_config.groups_per_step),
                     rollout=parts.get("rollout", world.rollout), verify=parts.get("verify", world.verify),
                     select=parts.get("select", world.select), board=PhaseBoard(),
                     check=parts.get("check", lambda: None))
    world.collector = collector
    return collector


def train(collector, world: FakeWorld, steps: int) -> list[tuple[int, list[Trajectory]]]:
    """The trainer's side: collect, 'update' (bump the version), tell the collector; returns what each step
    trained on, with the version it was trained against."""
    trained = []
    collector.start()
    try:
        for _ in range(steps):
            batch, _consumed = collector.collect()
            with world.lock:
                trained.append((world.version, [t for group in batch for t in group]))
                world.version += 1
            collector.trained()
    finally:
        collector.close()
    return trained


@pytest.mark.parametrize(("rolling", "pending", "open_"), [
    (0, 0, True), (3, 5, True), (4, 5, False),  # rollout slots full
    (1, 5, True), (1, 6, False), (0, 7, False),  # (max_staleness + 1) × groups_per_step = 6 pending at most
])
def test_admission_counts_slots_and_pending_groups(rolling, pending, open_):
    admission = Admission(rollout_concurrency=4, max_staleness=1, groups_per_step=3)
    assert admission.bound == 6
    assert admission.open(rolling=rolling, pending=pending) is open_


def test_a_step_wants_its_groups_but_consumes_no_more_than_the_oversampling_allows():
    run_config = config(groups_per_step=2, oversampling=3)
    assert step_wants_more([], [], run_config)
    assert not step_wants_more([[], []], [None, None], run_config)  # enough groups with signal
    assert not step_wants_more([], [None] * 6, run_config)  # six consumed, none usable: train on what there is


@pytest.mark.parametrize("max_staleness", [0, 1, 2])
def test_async_admission_bounds_pending_groups_and_staleness(max_staleness):
    world = FakeWorld(seed=max_staleness, max_staleness=max_staleness)
    run_config = config(mode="async", max_staleness=max_staleness, rollout_concurrency=8)
    trained = train(make(AsyncCollector, world, run_config), world, steps=12)
    assert 0 < world.max_pending <= (max_staleness + 1) * run_config.groups_per_step
    staleness = [version - t.policy_version for version, batch in trained for t in batch]
    assert min(staleness) >= 0 and max(staleness) <= max_staleness
    # Admission holds generation back rather than wasting it: few groups arrive too late to be trained on.
    assert world.too_stale <= 12 * run_config.groups_per_step // 4
    if max_staleness:
        assert max(staleness) > 0, "generation never overlapped training: the collector is not asynchronous"


def test_without_admission_the_same_workload_would_be_staler():
    """The bound is the admission's doing: let every group in at once and the same rollouts go stale."""
    world = FakeWorld(seed=1, max_staleness=10**6)
    run_config = config(mode="async", max_staleness=1, rollout_concurrency=8)
    collector = make(AsyncCollector, world, run_config)
    collector.admission = Admission(rollout_concurrency=8, max_staleness=10**6, groups_per_step=3)
    trained = train(collector, world, steps=12)
    assert max(version - t.policy_version for version, batch in trained for t in batch) > 1


def test_the_sync_collector_trains_on_its_draws_in_order_at_the_current_version():
    world = FakeWorld()
    trained = train(make(SyncCollector, world, config(mode="sync")), world, steps=4)
    seqs = [t.seq for _, batch in trained for t in batch[::2]]
    assert seqs == list(range(12))
    assert all(t.policy_version == version for version, batch in trained for t in batch)


def test_collector_for_follows_the_mode():
    world = FakeWorld()
    for mode, kind in (("async", AsyncCollector), ("sync", SyncCollector)):
        run_config = config(mode=mode)
        collector = collector_for(run_config, draws=Draws(Scheduler(TASKS.domains, seed=0), TASKS, batch=3),
                                  rollout=world.rollout, verify=world.verify, select=world.select, board=PhaseBoard(),
                                  check=lambda: None)
        assert type(collector) is kind
        collector.close()


@pytest.mark.parametrize("kind", [AsyncCollector, SyncCollector])
def test_a_failing_verification_reaches_the_trainer(kind):
    world = FakeWorld()

    def broken(task, trajectory):
        raise OSError("the verifier's disk is gone")

    collector = make(kind, world, config(mode="async" if kind is AsyncCollector else "sync"), verify=broken)
    with pytest.raises(OSError, match="disk is gone"):
        train(collector, world, steps=1)


@pytest.mark.parametrize("kind", [AsyncCollector, SyncCollector])
def test_a_lost_lease_stops_the_wait(kind):
    world = FakeWorld(slow=0.5)

    class LeaseLost(Exception):
        pass

    def check():
        raise LeaseLost("another worker took the run")

    collector = make(kind, world, config(mode="async" if kind is AsyncCollector else "sync"), check=check)
    with pytest.raises(LeaseLost):
        train(collector, world, steps=1)


def test_work_abandoned_by_close_is_no_failure_and_stays_pending_for_the_checkpoint():
    world = FakeWorld(slow=0.2)
    collector = make(AsyncCollector, world, config(mode="async", max_staleness=1, rollout_concurrency=4))
    collector.start()
    time.sleep(0.05)  # rollouts are under way
    collector.close()
    time.sleep(0.5)  # they finish after the close and find the executors shut
    assert collector._failure is None
    pending, buffered = collector.in_flight()
    assert pending and not buffered  # rolled out again on resume
    assert sorted(t.seq for t in pending) == list(range(len(pending)))


def test_restored_groups_are_collected_first():
    world = FakeWorld()
    collector = make(AsyncCollector, world, config(mode="async"))
    restored = world.rollout([TASKS.task(100 + n, TEMPLATE.key, f"t{n}") for n in range(3)], 2)
    collector.restore([Group(TASKS.task(100 + n, TEMPLATE.key, f"t{n}"), group) for n, group in enumerate(restored)])
    [(_, batch)] = train(collector, world, steps=1)
    assert sorted({t.seq for t in batch}) == [100, 101, 102]


def test_the_collectors_import_no_torch():
    probe = subprocess.run([sys.executable, "-c",
                            "import sys, workers.rl.rollout.collectors; print('torch' in sys.modules)"],
                           capture_output=True, text=True, check=True)
    assert probe.stdout.strip() == "False"

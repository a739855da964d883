"""Collecting a step's training data: verified groups of trajectories, drawn, rolled out and graded.

Two collectors behind one protocol (`Collector`):

- `AsyncCollector` (the default): the stages overlap. A dispatcher keeps up to `rollout_concurrency` groups
  rolling out; a finished rollout goes on to verification and frees its slot at once; verified groups wait in
  the buffer; each step takes whichever groups are ready, so the slowest trajectory never holds a batch.
  Staleness is bounded by admission (`Admission`): a new group may start only while the groups in flight,
  waiting and being trained on number fewer than (max_staleness + 1) × groups_per_step. A group started at
  policy version v is then trained on at version v + max_staleness at the latest, unless faster ones overtake
  it; one that still arrives too late is refused by the selection (counted, never silently used).
  Generation is held back rather than wasted. With partial rollouts (GRPOConfig.partial_rollouts) a trajectory
  in flight goes on under each new version, and the bound holds per token (`too_stale`): an overtaken long
  trajectory is trained on its recent tokens instead of being refused whole.
- `SyncCollector`: each step draws its groups, rolls all of them out, verifies all, then hands them over: the
  baseline. With a fixed seed it is deterministic, and a resumed run continues bit for bit.

A step wants `groups_per_step` groups that the selection accepts, and consumes at most `oversampling` ×
groups_per_step groups (dynamic sampling: groups without signal are consumed, archived and counted, not
trained on). The engine's work comes in as plain callables — `rollout(tasks, group_size)`, `verify(task,
trajectory)`, `select(group, consumed)` — so these rules are tested without a model, a sandbox or torch.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Protocol

from ..config import GRPOConfig
from ..tasks.scheduler import Scheduler
from ..tasks.taskset import TaskSet
from ..types import Task, Trajectory
from .idle import PhaseBoard

Rollout = Callable[[list[Task], int], list[list[Trajectory]]]  # (tasks, group size) -> one group per task
Verify = Callable[[Task, Trajectory], None]  # grades the trajectory in place
Select = Callable[["Group", list["Group"]], list[Trajectory] | None]  # the trajectories to train on, or None
Batch = list[list[Trajectory]]  # the groups a step trains on


@dataclass
class Group:
    """The `group_size` trajectories of one task."""

    task: Task
    trajectories: list[Trajectory]


@dataclass(frozen=True)
class Admission:
    """When the async collector may start another group: while fewer than `rollout_concurrency` roll out, and
    fewer than (max_staleness + 1) × groups_per_step are anywhere between their start and the end of the
    update that trains on them."""

    rollout_concurrency: int
    max_staleness: int
    groups_per_step: int

    @classmethod
    def from_config(cls, config: GRPOConfig) -> Admission:
        return cls(config.rollout_concurrency, config.max_staleness, config.groups_per_step)

    @property
    def bound(self) -> int:
        return (self.max_staleness + 1) * self.groups_per_step

    def open(self, *, rolling: int, pending: int) -> bool:
        """`rolling`: groups rolling out; `pending`: groups rolling out, verifying, buffered or in training."""
        return rolling < self.rollout_concurrency and pending < self.bound


class Draws:
    """The run's draws in order, each numbered by `seq`: what a resumed checkpoint left over first, then new
    batches from the scheduler."""

    def __init__(self, scheduler: Scheduler, tasks: TaskSet, *, batch: int):
        self.scheduler, self.tasks, self.batch = scheduler, tasks, batch
        self.next_seq = 0
        self.leftover: deque[Task] = deque()

    def new(self, count: int) -> list[Task]:
        drawn = [self.tasks.task(self.next_seq + index, scheduled.template, scheduled.task_key)
                 for index, scheduled in enumerate(self.scheduler.sample(count))]
        self.next_seq += len(drawn)
        return drawn

    def next(self) -> Task:
        if not self.leftover:
            self.leftover.extend(self.new(self.batch))
        return self.leftover.popleft()

    def take_leftover(self) -> list[Task]:
        taken = list(self.leftover)
        self.leftover.clear()
        return taken


def too_stale(trajectories: list[Trajectory], *, version: int, max_staleness: int, per_token: bool = False) -> bool:
    """Whether a group sampled by older weights than `version` - `max_staleness` (one that faster groups
    overtook while admission held it in flight) must not be trained on at `version`.

    per_token (partial rollouts): the bound holds per token, the older tokens left out of the loss
    (trainer.training_rows), so the group is too stale only when none of its trajectories has a trainable token
    that recent. A long trajectory overtaken by short ones went on sampling under the new weights: its last
    turns are as fresh as anything in the batch, and its reward is the outcome of those turns too, so its
    group's advantages still hold for them. Masking its old tokens rather than dropping it keeps the expensive
    end of a long rollout; training on them would take importance ratios against weights the policy has moved
    far from, whose clipped gradients are mostly noise."""
    if per_token:
        newest = max(max(t.trained_versions(), default=t.policy_version) for t in trajectories)
        return version - newest > max_staleness
    return version - min(t.policy_version for t in trajectories) > max_staleness


def step_wants_more(batch: Batch, consumed: list[Group], config: GRPOConfig) -> bool:
    return (len(batch) < config.groups_per_step
            and len(consumed) < config.oversampling * config.groups_per_step)


class Collector(Protocol):
    def start(self) -> None: ...
    def collect(self) -> tuple[Batch, list[Group]]: ...  # one step's batch, and every group it consumed
    def trained(self) -> None: ...  # the step's update is done: its groups no longer count as pending
    def in_flight(self) -> tuple[list[Task], list[Group]]: ...  # for a checkpoint: unverified draws, buffer
    def restore(self, groups: list[Group]) -> None: ...  # a checkpoint's verified groups
    def close(self) -> None: ...


class _Waiting:
    """What both collectors share: their executors, and waiting on them while the trainer's idle time is shared
    out on the phase board and the run's health is checked."""

    def __init__(self, *, config: GRPOConfig, draws: Draws, rollout: Rollout, verify: Verify, select: Select,
                 board: PhaseBoard, check: Callable[[], None]):
        self.config, self.draws, self.board, self.check = config, draws, board, check
        self.rollout, self.verify, self.select = rollout, verify, select
        self._rollouts = ThreadPoolExecutor(max_workers=config.rollout_concurrency, thread_name_prefix="rl-rollout")
        self._verifications = ThreadPoolExecutor(max_workers=config.verify_concurrency,
                                                 thread_name_prefix="rl-verify")

    def _shutdown_executors(self) -> None:
        for executor in (self._rollouts, self._verifications):
            executor.shutdown(wait=False, cancel_futures=True)


class SyncCollector(_Waiting):
    def start(self) -> None:
        pass

    def collect(self) -> tuple[Batch, list[Group]]:
        batch: Batch = []
        consumed: list[Group] = []
        per_step = self.config.groups_per_step
        while step_wants_more(batch, consumed, self.config):
            room = self.config.oversampling * per_step - len(consumed)
            tasks = self.draws.take_leftover() or self.draws.new(min(per_step - len(batch), room))
            # All of the round's groups in one rollout: one engine batch per turn, the same batches every run.
            rollout = self._rollouts.submit(self.rollout, tasks, self.config.group_size)
            self._wait([rollout])
            groups = [Group(task, trajectories) for task, trajectories in zip(tasks, rollout.result(), strict=True)]
            checks = [self._verifications.submit(self.verify, g.task, t) for g in groups for t in g.trajectories]
            self._wait(checks)
            for future in checks:
                future.result()
            for group in groups:  # in draw order: the same seed gives the same batch
                usable = self.select(group, consumed)
                if usable is not None and len(batch) < per_step:
                    batch.append(usable)
        return batch, consumed

    def _wait(self, futures) -> None:
        last, pending = time.monotonic(), set(futures)
        while pending:
            self.check()
            _, pending = wait(pending, timeout=0.05)
            now = time.monotonic()
            self.board.accrue(now - last)
            last = now

    def trained(self) -> None:
        pass

    def in_flight(self) -> tuple[list[Task], list[Group]]:
        return list(self.draws.leftover), []

    def restore(self, groups: list[Group]) -> None:
        if groups:
            raise ValueError("a sync run's checkpoint holds no verified groups; this one was written by an "
                             "async run")

    def close(self) -> None:
        self._shutdown_executors()


class AsyncCollector(_Waiting):
    def __init__(self, **parts):
        super().__init__(**parts)
        self.admission = Admission.from_config(self.config)
        self._cond = threading.Condition()
        self._rolling: dict[int, Task] = {}
        self._verifying: dict[int, Task] = {}
        self._buffer: deque[Group] = deque()
        self._in_training = 0
        self._closed = False
        self._failure: BaseException | None = None

    def pending(self) -> int:
        """Groups between their start and the end of the update that trains on them (call locked)."""
        return len(self._rolling) + len(self._verifying) + len(self._buffer) + self._in_training

    def start(self) -> None:
        threading.Thread(target=self._dispatch, name="rl-dispatcher", daemon=True).start()

    def _dispatch(self) -> None:
        try:
            while True:
                with self._cond:
                    while not self._closed and not self.admission.open(rolling=len(self._rolling),
                                                                       pending=self.pending()):
                        self._cond.wait(0.5)
                    if self._closed:
                        return
                    task = self.draws.next()
                    self._rolling[task.seq] = task
                    # Submitted under the lock: close() marks the collector closed before its executors shut.
                    self._rollouts.submit(self._rollout_then_verify, task)
        except BaseException as exc:
            self._fail(exc)

    def _rollout_then_verify(self, task: Task) -> None:
        try:
            [trajectories] = self.rollout([task], self.config.group_size)
            with self._cond:
                if self._closed:
                    return
                self._rolling.pop(task.seq, None)
                self._verifying[task.seq] = task
                futures = [self._verifications.submit(self.verify, task, t) for t in trajectories]
                self._cond.notify_all()  # a rollout slot is free
            remaining = [len(futures)]

            def verified(_future) -> None:
                with self._cond:
                    remaining[0] -= 1
                    if remaining[0] == 0 and not self._closed and all(
                            not f.cancelled() and f.exception() is None for f in futures):
                        self._verifying.pop(task.seq, None)
                        self._buffer.append(Group(task, trajectories))
                        self._cond.notify_all()

            for future in futures:
                future.add_done_callback(verified)
                future.add_done_callback(self._fail_from)
        except BaseException as exc:
            self._fail(exc)

    def _fail_from(self, future) -> None:
        if not future.cancelled() and future.exception() is not None:
            self._fail(future.exception())

    def _fail(self, exc: BaseException) -> None:
        with self._cond:
            if self._closed:
                return  # work that close() abandoned: what becomes of it no longer matters
            if self._failure is None:
                self._failure = exc
            self._cond.notify_all()

    def _check(self) -> None:
        self.check()
        if self._failure is not None:
            raise self._failure

    def collect(self) -> tuple[Batch, list[Group]]:
        batch: Batch = []
        consumed: list[Group] = []
        last = time.monotonic()
        while step_wants_more(batch, consumed, self.config):
            with self._cond:
                self._check()
                while not self._buffer:
                    self._check()
                    self._cond.wait(0.05)
                    now = time.monotonic()
                    self.board.accrue(now - last)
                    last = now
                group = self._buffer.popleft()
                usable = self.select(group, consumed)
                if usable is not None:
                    batch.append(usable)
                    self._in_training += 1
                self._cond.notify_all()
        return batch, consumed

    def trained(self) -> None:
        with self._cond:
            self._in_training = 0
            self._cond.notify_all()

    def in_flight(self) -> tuple[list[Task], list[Group]]:
        with self._cond:
            tasks = sorted([*self.draws.leftover, *self._rolling.values(), *self._verifying.values()],
                           key=lambda t: t.seq)
            return tasks, list(self._buffer)

    def restore(self, groups: list[Group]) -> None:
        with self._cond:
            self._buffer.extend(groups)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._shutdown_executors()


def collector_for(config: GRPOConfig, **parts) -> Collector:
    return (AsyncCollector if config.mode == "async" else SyncCollector)(config=config, **parts)

"""The training pipeline: draw tasks → roll out (tool calls in the sandbox pool) → verify → train → archive.

async (the default): the stages overlap. A dispatcher keeps up to `rollout_concurrency` groups rolling out;
a finished rollout goes on to verification and frees its slot at once; verified groups wait in the buffer;
the trainer takes whichever groups are ready, so the slowest trajectory never holds a batch. Staleness is
bounded by admission: a new group may start only while the groups in flight, waiting and being trained on
number fewer than (max_staleness + 1) × groups_per_step. A group started at policy version v is then
trained on at version v + max_staleness at the latest — unless it is overtaken by faster ones; one that
still arrives too late is not trained on (counted, never silently used). Generation is held back rather
than wasted.

sync: each step draws its groups, rolls all of them out, verifies all, then trains — the baseline. With a
fixed seed it is deterministic, and a resumed run continues bit for bit.

With dynamic sampling (the default), a step takes `groups_per_step` groups that carry signal; groups whose
rewards are all equal are consumed, archived and counted as not effective. A step consumes at most
`oversampling` × groups_per_step groups, then trains on what signal it found. Every consumed trajectory is
archived with the step that consumed it, through the Tracker (the studio's database, or memory).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from workers.verifiers import Sample

from .agent import PhaseBoard, rollout_groups
from .checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from .config import RunConfig
from .metrics import Prices, RunCounters, step_points, trajectory_cost
from .scheduler import ScheduledTask, Scheduler
from .trainer import GRPOTrainer, assign_advantages
from .types import Task, TaskTemplate, Trajectory, TrajectoryStatus


class LeaseLost(Exception):
    """Another worker took the run over: stop writing at once."""


class Tracker(Protocol):
    """Where the pipeline reports; the studio's implementation writes through apps.runs.services."""

    def step(self, *, step: int, wall_time: float, points: dict, trajectories: list[Trajectory],
             events: list[tuple[str, str, dict]]) -> None: ...
    def checkpoint(self, *, step: int, path: str, size: int, removed: list[int]) -> None: ...
    def event(self, kind: str, message: str, *, step: int | None = None, details: dict | None = None) -> None: ...
    def heartbeat(self) -> str: ...  # "" | "pause" | "cancel"; raises LeaseLost
    def rollback(self, step: int) -> None: ...  # forget what an earlier attempt wrote after `step`


@dataclass
class MemoryTracker:
    """Keeps everything in lists: for tests, benchmarks and notebooks."""

    steps: list = field(default_factory=list)
    trajectories: dict = field(default_factory=dict)
    checkpoints: list = field(default_factory=list)
    events: list = field(default_factory=list)
    requested: str = ""
    on_step: Callable | None = None

    def step(self, *, step, wall_time, points, trajectories, events):
        self.steps = [s for s in self.steps if s["step"] != step] + [{"step": step, "points": points}]
        self.trajectories.update({t.id: t for t in trajectories})
        self.events += [(kind, message) for kind, message, _ in events]
        if self.on_step:
            self.on_step(step, points)

    def checkpoint(self, *, step, path, size, removed):
        self.checkpoints.append(step)

    def event(self, kind, message, *, step=None, details=None):
        self.events.append((kind, message))

    def heartbeat(self):
        return self.requested

    def rollback(self, step):
        self.steps = [s for s in self.steps if s["step"] <= step]
        self.trajectories = {k: t for k, t in self.trajectories.items() if (t.step or 0) <= step}


class TaskCatalog:
    """Pinned task templates and their instances: what a drawn (template, task key) is."""

    def __init__(self, templates: dict[str, TaskTemplate], item: Callable, item_hash: Callable):
        self.templates, self._item, self._item_hash = templates, item, item_hash

    def task(self, seq: int, template_key: str, task_key: str) -> Task:
        item = self._item(template_key, task_key)
        return Task(seq=seq, template=self.templates[template_key], item=item,
                    item_hash=self._item_hash(template_key, task_key))


class LocalVerifier:
    """Verification in this process: workers.verifiers over a SandboxPool, with the judge if configured."""

    def __init__(self, pool, judge=None):
        self.pool, self.judge = pool, judge

    def verify(self, template: TaskTemplate, trajectory: Trajectory, item):
        from workers.verifiers import Context, verify

        logs = "\n".join(t.result.get("stdout", "") + t.result.get("stderr", "") for t in trajectory.turns
                         if t.role == "tool")
        sample = Sample(response=trajectory.response, logs=logs, trajectory_id=trajectory.id)
        context = Context(pool=self.pool, image=template.image, judge=self.judge)
        return verify(template.verifier_spec, sample, item, context)


def verify_trajectory(verifier, task: Task, trajectory: Trajectory) -> None:
    """Grade a finished rollout in place: its reward, verdict (without artifacts), artifacts, judge cost and
    verification time. A rollout that timed out or broke the policy's rules scores 0 unverified; one whose
    infrastructure failed, or that the verifier could not grade, is an infra error with no reward."""
    started = time.monotonic()
    try:
        if trajectory.status in (TrajectoryStatus.TIMEOUT, TrajectoryStatus.POLICY_ERROR):
            trajectory.reward = 0.0
            trajectory.verdict = {"reward": 0.0, "status": "fail", "components": [], "layers_run": [],
                                  "stopped_because": f"not verified: the rollout ended as {trajectory.status} "
                                                     f"({trajectory.status_reason})"}
            return
        if trajectory.status == TrajectoryStatus.INFRA_ERROR:
            return
        verdict = verifier.verify(task.template, trajectory, task.item)
        data = verdict.to_json()
        data.pop("artifacts", None)
        trajectory.verdict = data
        trajectory.artifacts = dict(verdict.artifacts)
        trajectory.costs["judge"] = verdict.cost
        if verdict.reward is None:
            trajectory.status = TrajectoryStatus.INFRA_ERROR
            trajectory.status_reason = f"verification could not grade: {verdict.stopped_because}"
        else:
            trajectory.reward = verdict.reward
    finally:
        seconds = time.monotonic() - started
        trajectory.timings["verification"] = seconds
        trajectory.costs["verification_seconds"] = seconds
        trajectory.finished_at = time.time()
        trajectory.timings["total"] = trajectory.finished_at - trajectory.started_at


@dataclass
class _Group:
    task: Task
    trajectories: list[Trajectory]


class Pipeline:
    HEARTBEAT_SECONDS = 2.0

    def __init__(self, *, run_id: str, config: RunConfig, total_steps: int, catalog: TaskCatalog,
                 scheduler: Scheduler, engine, chat, policy, trainer: GRPOTrainer, tool_runner, verifier,
                 tracker: Tracker, checkpoint_dir: Path, prices: Prices | None = None, eval_tasks: list | None = None,
                 progress: Callable | None = None):
        self.run_id, self.config, self.total_steps = run_id, config, total_steps
        self.catalog, self.scheduler, self.engine, self.chat = catalog, scheduler, engine, chat
        self.policy, self.trainer, self.tool_runner, self.verifier = policy, trainer, tool_runner, verifier
        self.tracker, self.checkpoint_dir, self.prices = tracker, Path(checkpoint_dir), prices or Prices()
        self.eval_tasks = eval_tasks or []  # [(template key, task key)] fixed for the run
        self.progress = progress
        self.board = PhaseBoard()
        self.counters = RunCounters()
        self.next_seq = 0
        self.eval_start: dict[str, float] = {}
        self._cond = threading.Condition()
        self._drawn: deque[Task] = deque()
        self._rolling: dict[int, Task] = {}
        self._verifying: dict[int, Task] = {}
        self._buffer: deque[_Group] = deque()
        self._in_training = 0
        self._stop = False
        self._failure: BaseException | None = None
        self._requested = ""
        self._lease_lost = False
        self._tools = ThreadPoolExecutor(max_workers=max(4, config.rollout_concurrency * 2),
                                         thread_name_prefix="rl-tools")
        self._rollouts = ThreadPoolExecutor(max_workers=config.rollout_concurrency, thread_name_prefix="rl-rollout")
        self._verifications = ThreadPoolExecutor(max_workers=config.verify_concurrency, thread_name_prefix="rl-verify")

    # --- the run -----------------------------------------------------------------------------------------

    def run(self) -> dict:
        """Train to `total_steps` (or until paused or cancelled); returns the summary."""
        started = time.monotonic()
        resumed_from = self._restore()
        self.engine.load_weights(self.policy.inference_state(), self.trainer.step)
        heartbeat = threading.Thread(target=self._heartbeat_loop, name="rl-heartbeat", daemon=True)
        heartbeat.start()
        outcome = "completed"
        try:
            if resumed_from is None and self.eval_tasks:
                self.eval_start = self.evaluate()
                self.tracker.step(step=0, wall_time=time.time(), trajectories=[], events=[],
                                  points={f"eval/reward/{d}": r for d, r in self.eval_start.items()})
            if self.config.mode == "async":
                self._start_dispatcher()
            self._step_mark, self._bookkeeping_seconds = time.monotonic(), 0.0
            while self.trainer.step < self.total_steps:
                self._check_lease()
                groups, consumed = self._collect_sync() if self.config.mode == "sync" else self._collect_async()
                self._train_and_record(groups, consumed)
                requested = self._requested
                if requested in ("pause", "cancel"):
                    outcome = "paused" if requested == "pause" else "cancelled"
                    break
            self._shutdown()
            if outcome == "paused" and not self._saved_at_current_step():
                self._save_checkpoint()
            eval_end = self.evaluate() if outcome == "completed" and self.eval_tasks else {}
            if eval_end:
                self.tracker.step(step=self.trainer.step, wall_time=time.time(), trajectories=[], events=[],
                                  points={f"eval/reward/{d}": r for d, r in eval_end.items()})
            return self.summary(outcome=outcome, eval_end=eval_end, wall_seconds=time.monotonic() - started,
                                resumed_from=resumed_from)
        finally:
            self._stop = True
            self._shutdown()

    def _check_lease(self) -> None:
        if self._lease_lost:
            raise LeaseLost(f"run {self.run_id} was taken over by another worker")
        if self._failure is not None:
            raise self._failure

    def _heartbeat_loop(self) -> None:
        while not self._stop:
            try:
                self._requested = self.tracker.heartbeat() or ""
            except LeaseLost:
                self._lease_lost = True
                with self._cond:
                    self._cond.notify_all()
                return
            except Exception:  # a database blip: try again next beat; the watchdog's timeout is much longer
                pass
            time.sleep(self.HEARTBEAT_SECONDS)

    # --- async collection --------------------------------------------------------------------------------

    def _start_dispatcher(self) -> None:
        threading.Thread(target=self._dispatch_loop, name="rl-dispatcher", daemon=True).start()

    def _admission_open(self) -> bool:
        pending = len(self._rolling) + len(self._verifying) + len(self._buffer) + self._in_training
        return (len(self._rolling) < self.config.rollout_concurrency
                and pending < (self.config.max_staleness + 1) * self.config.groups_per_step)

    def _dispatch_loop(self) -> None:
        try:
            while True:
                with self._cond:
                    while not self._stop and not self._admission_open():
                        self._cond.wait(0.5)
                    if self._stop:
                        return
                    task = self._next_task()
                    self._rolling[task.seq] = task
                self._rollouts.submit(self._rollout_then_verify, task)
        except BaseException as exc:
            self._fail(exc)

    def _next_task(self) -> Task:
        """The next draw: a draw left over from a resumed checkpoint first, then new batches (call locked)."""
        if not self._drawn:
            for scheduled in self.scheduler.sample(self.config.groups_per_step):
                self._drawn.append(self._task_for(scheduled))
        return self._drawn.popleft()

    def _task_for(self, scheduled: ScheduledTask) -> Task:
        task = self.catalog.task(self.next_seq, scheduled.template, scheduled.task_key)
        self.next_seq += 1
        return task

    def _rollout_then_verify(self, task: Task) -> None:
        try:
            [trajectories] = self._rollout([task], self.config.group_size)
            with self._cond:
                self._rolling.pop(task.seq, None)
                self._verifying[task.seq] = task
                self._cond.notify_all()  # a rollout slot is free
            futures = [self._verifications.submit(self._verify, task, t) for t in trajectories]
            remaining = [len(futures)]

            def done(_future):
                with self._cond:
                    remaining[0] -= 1
                    if remaining[0] == 0 and not self._stop and all(
                            not f.cancelled() and f.exception() is None for f in futures):
                        self._verifying.pop(task.seq, None)
                        self._buffer.append(_Group(task, trajectories))
                        self._cond.notify_all()
            for future in futures:
                future.add_done_callback(done)
                future.add_done_callback(self._raise_from)
        except BaseException as exc:
            self._fail(exc)

    def _raise_from(self, future) -> None:
        if not future.cancelled() and future.exception() is not None:  # cancelled: the pipeline is closing
            self._fail(future.exception())

    def _fail(self, exc: BaseException) -> None:
        if self._stop and isinstance(exc, RuntimeError) and "shutdown" in str(exc):
            return  # work submitted while the pipeline was closing
        with self._cond:
            if self._failure is None:
                self._failure = exc
            self._cond.notify_all()

    def _step_wants_more(self, batch: list, consumed: list) -> bool:
        return (len(batch) < self.config.groups_per_step
                and len(consumed) < self.config.oversampling * self.config.groups_per_step)

    def _collect_async(self) -> tuple[list[list[Trajectory]], list[_Group]]:
        batch, consumed = [], []
        last = time.monotonic()
        while self._step_wants_more(batch, consumed):
            with self._cond:
                self._check_lease()
                while not self._buffer:
                    self._check_lease()
                    self._cond.wait(0.05)
                    now = time.monotonic()
                    self.board.accrue(now - last)
                    last = now
                group = self._buffer.popleft()
                usable = self._classify(group, consumed)
                if usable is not None:
                    batch.append(usable)
                    self._in_training += 1
                self._cond.notify_all()
        return batch, consumed

    # --- sync collection ---------------------------------------------------------------------------------

    def _collect_sync(self) -> tuple[list[list[Trajectory]], list[_Group]]:
        batch, consumed = [], []
        while self._step_wants_more(batch, consumed):
            room = self.config.oversampling * self.config.groups_per_step - len(consumed)
            tasks = list(self._drawn) if self._drawn else [
                self._task_for(s) for s in self.scheduler.sample(min(self.config.groups_per_step - len(batch), room))]
            self._drawn.clear()
            # All of the round's groups in one rollout: one engine batch per turn, the same batches every run.
            rollout = self._rollouts.submit(self._rollout, tasks, self.config.group_size)
            self._wait_accruing([rollout])
            groups = list(zip(tasks, rollout.result(), strict=True))
            checks = [(self._verifications.submit(self._verify, task, t)) for task, group in groups for t in group]
            self._wait_accruing(checks)
            for future in checks:
                future.result()
            for task, trajectories in groups:  # in draw order: the same seed gives the same batch
                usable = self._classify(_Group(task, trajectories), consumed)
                if usable is not None and len(batch) < self.config.groups_per_step:
                    batch.append(usable)
        return batch, consumed

    def _wait_accruing(self, futures) -> None:
        last = time.monotonic()
        pending = set(futures)
        while pending:
            self._check_lease()
            _, pending = wait(pending, timeout=0.05)
            now = time.monotonic()
            self.board.accrue(now - last)
            last = now

    # --- the stages ----------------------------------------------------------------------------------------

    def _rollout(self, tasks: list[Task], group_size: int, tools: ThreadPoolExecutor | None = None) -> list[list[Trajectory]]:
        return rollout_groups(tasks, run_id=self.run_id, group_size=group_size, engine=self.engine, chat=self.chat,
                              tool_runner=self.tool_runner, tool_executor=tools or self._tools, board=self.board,
                              seed=self.config.seed, temperature=self.config.temperature)

    def _verify(self, task: Task, trajectory: Trajectory) -> None:
        try:
            verify_trajectory(self.verifier, task, trajectory)
        finally:
            self.board.finish(trajectory.id)

    def _classify(self, group: _Group, consumed: list[_Group]) -> list[Trajectory] | None:
        """Decide what the trainer does with a verified group: returns the trajectories to train on, or None
        (kept in `consumed` for the archive either way)."""
        consumed.append(group)
        usable = [t for t in group.trajectories if t.status != TrajectoryStatus.INFRA_ERROR]
        for t in group.trajectories:
            t.effective = False
        if len(usable) < 2:
            return None
        if self.scheduler.curriculum is not None:
            self.scheduler.curriculum.observe(ScheduledTask(group.task.domain, group.task.template.key,
                                                            group.task.item.key), [t.reward for t in usable])
        if self.trainer.step - min(t.policy_version for t in usable) > self.config.max_staleness:
            for t in usable:
                t.status_reason = (t.status_reason + "; " if t.status_reason else "") + "too stale to train on"
            return None
        effective = assign_advantages(usable, normalize_std=self.config.normalize_std)
        if not effective and self.config.dynamic_sampling:
            return None
        for t in usable:
            t.effective = effective
        return usable

    # --- a step ----------------------------------------------------------------------------------------------

    def _train_and_record(self, batch: list[list[Trajectory]], consumed: list[_Group]) -> None:
        """Train on the batch, hand the engine the new weights, archive the step. A step's active time runs from
        the end of the previous step's update to the end of this one's, so the previous step's bookkeeping
        (archive, checkpoint) is in it, as idle time of its own."""
        version_before = self.trainer.step
        idle = self.board.drain()
        stats = self.trainer.train(batch)
        sync_started = time.monotonic()
        self.engine.load_weights(self.policy.inference_state(), self.trainer.step)
        idle["weight_sync"] = time.monotonic() - sync_started
        idle["archive"], self._bookkeeping_seconds = self._bookkeeping_seconds, 0.0
        with self._cond:
            self._in_training = 0
            self._cond.notify_all()
        step = self.trainer.step
        trained = [t for group in batch for t in group]
        staleness = [version_before - t.policy_version for t in trained]
        trained_tokens = max(1, sum(t.completion_tokens for t in trained))
        all_trajectories = [t for group in consumed for t in group.trajectories]
        for t in all_trajectories:
            t.step = step
        for t in trained:  # the update's compute, shared by the tokens it trained on
            t.costs["policy_seconds"] = t.costs.get("policy_seconds", 0.0) + stats.seconds * t.completion_tokens / trained_tokens
        for t in all_trajectories:
            trajectory_cost(t, self.prices)
        now = time.monotonic()
        step_seconds, self._step_mark = now - self._step_mark, now
        self.counters.active_seconds += step_seconds
        self.counters.trainer_seconds += stats.seconds
        tokens = sum(t.completion_tokens for t in all_trajectories)
        points = step_points(counters=self.counters, consumed=all_trajectories, trained=trained, stats=stats,
                             idle=idle, step_seconds=step_seconds, groups=len(consumed), effective_groups=len(batch),
                             generation_tokens_per_second=tokens / step_seconds, staleness=staleness)
        events = []
        retries = sum(t.tool_retries for t in all_trajectories)
        if retries:
            events.append(("retry", f"{retries} sandbox call(s) retried after infrastructure errors", {}))
        infra = [t for t in all_trajectories if t.status == TrajectoryStatus.INFRA_ERROR]
        if infra:
            events.append(("retry", f"{len(infra)} trajectory(ies) lost to infrastructure errors and not trained on: "
                                    f"{infra[0].status_reason[:200]}", {}))
        self._check_lease()
        self.tracker.step(step=step, wall_time=time.time(), points=points, trajectories=all_trajectories,
                          events=events)
        if step % self.config.checkpoint_every == 0 or step == self.total_steps:
            self._save_checkpoint()
        # Asked at every step's end as well as by the heartbeat thread: a pause lands on this step.
        self._requested = self.tracker.heartbeat() or ""
        self._bookkeeping_seconds = time.monotonic() - now
        if self.progress:
            self.progress(step, self.total_steps, points)

    # --- checkpoints -------------------------------------------------------------------------------------------

    def pipeline_state(self) -> dict:
        with self._cond:
            pending = sorted([*self._drawn, *self._rolling.values(), *self._verifying.values()], key=lambda t: t.seq)
            buffer = [[t.to_json() for t in group.trajectories] for group in self._buffer]
        return {"step": self.trainer.step, "next_seq": self.next_seq, "scheduler": self.scheduler.state(),
                "pending": [[t.seq, t.template.key, t.item.key] for t in pending], "buffer": buffer,
                "counters": self.counters.state(), "eval_start": self.eval_start}

    def _save_checkpoint(self) -> None:
        checkpoint, removed = save_checkpoint(self.checkpoint_dir, step=self.trainer.step, policy=self.policy,
                                              trainer_state=self.trainer.state(), pipeline_state=self.pipeline_state(),
                                              keep=self.config.keep_checkpoints)
        self._last_saved = self.trainer.step
        self.tracker.checkpoint(step=checkpoint.step, path=str(checkpoint.path), size=checkpoint.size, removed=removed)

    def _saved_at_current_step(self) -> bool:
        return getattr(self, "_last_saved", None) == self.trainer.step

    def _restore(self) -> int | None:
        checkpoint = latest_checkpoint(self.checkpoint_dir)
        if checkpoint is None:
            self.tracker.rollback(0)
            return None
        trainer_state, state = load_checkpoint(checkpoint, policy=self.policy, device=self.policy.device)
        self.trainer.restore(trainer_state)
        self.scheduler.restore(state["scheduler"])
        self.next_seq = state["next_seq"]
        self.counters = RunCounters.from_state(state["counters"])
        self.eval_start = state.get("eval_start", {})
        for seq, template_key, task_key in state["pending"]:
            self._drawn.append(self.catalog.task(seq, template_key, task_key))
        for group in state["buffer"]:
            trajectories = [Trajectory.from_json(t) for t in group]
            first = trajectories[0]
            self._buffer.append(_Group(self.catalog.task(first.seq, first.template, first.task_key), trajectories))
        self._last_saved = checkpoint.step
        self.tracker.rollback(checkpoint.step)
        self.tracker.event("resumed", f"resumed from the checkpoint at step {checkpoint.step}: "
                                      f"{len(self._drawn)} draw(s) to roll out again, {len(self._buffer)} verified "
                                      "group(s) restored", step=checkpoint.step)
        return checkpoint.step

    def _shutdown(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        for executor in (self._rollouts, self._verifications, self._tools):
            executor.shutdown(wait=False, cancel_futures=True)

    # --- evaluation and summary --------------------------------------------------------------------------------

    def evaluate(self) -> dict[str, float]:
        """Mean reward per domain on the run's fixed evaluation tasks, one sample each, current weights."""
        tasks = [self.catalog.task(-1 - index, template, key) for index, (template, key) in enumerate(self.eval_tasks)]
        # Its own tool threads: the evaluation at the end runs after the pipeline's executors have closed.
        with ThreadPoolExecutor(max_workers=self.config.rollout_concurrency, thread_name_prefix="rl-eval-tools") as tools:
            groups = self._rollout(tasks, 1, tools)
        with ThreadPoolExecutor(max_workers=self.config.verify_concurrency, thread_name_prefix="rl-eval") as pool:
            list(pool.map(lambda pair: self._verify(*pair), [(task, g[0]) for task, g in zip(tasks, groups, strict=True)]))
        self.board.drain()  # evaluation is not the trainer's idle time
        rewards: dict[str, list[float]] = {}
        for task, group in zip(tasks, groups, strict=True):
            if group[0].reward is not None:
                rewards.setdefault(task.domain, []).append(group[0].reward)
        return {domain: round(sum(r) / len(r), 4) for domain, r in sorted(rewards.items())}

    def summary(self, *, outcome: str, eval_end: dict, wall_seconds: float, resumed_from: int | None) -> dict:
        counters = self.counters
        hours = max(counters.active_seconds, 1e-9) / 3600
        return {
            "run": self.run_id, "outcome": outcome, "steps": self.trainer.step, "mode": self.config.mode,
            "resumed_from_step": resumed_from, "wall_seconds": round(wall_seconds, 1),
            "reward": {"start": self.eval_start, "end": eval_end,
                       "lift": {d: round(eval_end[d] - self.eval_start[d], 4) for d in eval_end if d in self.eval_start}},
            "trajectories": {"total": counters.trajectories, "effective": counters.effective_trajectories,
                             **dict(counters.statuses)},
            "throughput": {"trajectories_per_hour": round(counters.trajectories / hours, 1),
                           "effective_trajectories_per_hour": round(counters.effective_trajectories / hours, 1)},
            "cost": {"per_task": counters.cost / max(counters.trajectories, 1), "total": counters.cost},
            "trainer_busy_fraction": round(counters.trainer_seconds / max(counters.active_seconds, 1e-9), 4),
            "idle_seconds": {cause: round(seconds, 2) for cause, seconds in counters.idle.items()},
            "staleness": {"max": counters.staleness_max, "bound": self.config.max_staleness},
        }

"""The training pipeline: draw tasks → roll out (tool calls in the sandbox pool) → grade → train → archive.

`Pipeline.run` reads top to bottom: restore the last checkpoint → evaluate → (collect a step's groups, train
on them, record the step, checkpoint) until the last step or a pause → evaluate → summary. Collection is a
collector's job (rollout/collectors.py: async with bounded staleness, or sync); grading is rollout/grading.py's;
where the numbers go is the tracker's (training/tracking.py). Every consumed trajectory is archived with the
step that consumed it. Built in one place: workers/rl/session.py.

An attempt is abandoned (AttemptAbandoned, the run left to be resumed from its newest checkpoint) at the first
check after its process starts stopping (`stop`) or after `stuck_after` seconds without progress (the heartbeat
then stops too): checks come at each step's start, before each step is recorded, and every 50 ms while the
trainer waits for rollouts and verifications. An update, a checkpoint or an evaluation under way is not
interrupted: it ends first, or the process's own stop deadline ends it (apps/runs/embedded.py).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor, ThreadPoolExecutor
from pathlib import Path

from workers.storage import Storage

from .config import RunConfig
from .models.allocator import give_back_free_heap_pages
from .protocols import ChatFormat, Engine, Policy, ToolRunner, Tracker, Verifier
from .rollout.agent import rollout_groups
from .rollout.collectors import Batch, Draws, Group, collector_for, too_stale
from .rollout.evaluation import evaluate
from .rollout.grading import grade_trajectory
from .rollout.idle import PhaseBoard
from .rollout.metrics import Prices, RunCounters, run_summary, step_events, step_points, trajectory_cost
from .tasks.scheduler import ScheduledTask, Scheduler
from .tasks.taskset import TaskSet
from .training.attempt import check_attempt, write_checkpoint
from .training.checkpoint import checkpoint_storage, load_checkpoint, resume_checkpoint
from .training.tracking import Heartbeat
from .training.trainer import GRPOTrainer, assign_advantages
from .types import Task, Trajectory, TrajectoryStatus


class Pipeline:
    def __init__(self, *, run_id: str, config: RunConfig, total_steps: int, tasks: TaskSet, scheduler: Scheduler,
                 engine: Engine, chat: ChatFormat, policy: Policy, trainer: GRPOTrainer, tool_runner: ToolRunner,
                 verifier: Verifier, tracker: Tracker, checkpoint_dir: Path | Storage, prices: Prices,
                 eval_tasks: list[tuple[str, str]], progress: Callable | None = None,
                 stop: threading.Event | None = None, stuck_after: float | None = None):
        self.run_id, self.config, self.total_steps, self.tasks = run_id, config, total_steps, tasks
        self.scheduler, self.engine, self.chat, self.policy, self.trainer = scheduler, engine, chat, policy, trainer
        self.tool_runner, self.verifier, self.tracker = tool_runner, verifier, tracker
        self.checkpoint_dir, self.prices, self.progress = checkpoint_storage(checkpoint_dir), prices, progress
        self.eval_tasks = eval_tasks  # [(template key, task key)], fixed for the run
        self.eval_start: dict[str, float] = {}
        self.board = PhaseBoard()
        self.counters = RunCounters()
        self.heartbeat = Heartbeat(tracker, stuck_after=stuck_after)
        self.stop = stop
        self._tools = ThreadPoolExecutor(max_workers=max(4, config.rollout_concurrency * 2),
                                         thread_name_prefix="rl-tools")
        self.draws = Draws(scheduler, tasks, batch=config.groups_per_step)
        self.collector = collector_for(config, draws=self.draws, rollout=self._rollout, verify=self._grade,
                                       select=self._select, board=self.board, check=self._check)
        self._last_saved: int | None = None  # the step of the newest checkpoint
        self._step_mark = 0.0  # when the previous step's update ended
        self._bookkeeping_seconds = 0.0  # the previous step's archive and checkpoint

    # --- the run -----------------------------------------------------------------------------------------

    def run(self) -> dict:
        """Train to `total_steps` (or until paused or cancelled); returns the summary."""
        started = time.monotonic()
        resumed_from = self._restore()
        self._hand_weights()
        self.heartbeat.start()
        try:
            if resumed_from is None and self.eval_tasks:
                self.eval_start = self._evaluate()
                self._check()
            outcome = self._train()
            self._close_collection()
            if outcome == "paused" and self._last_saved != self.trainer.step:
                self._save_checkpoint()
            eval_end = self._evaluate() if outcome == "completed" and self.eval_tasks else {}
            summary = run_summary(run_id=self.run_id, outcome=outcome, steps=self.trainer.step,
                                  mode=self.config.mode, max_staleness=self.config.max_staleness,
                                  counters=self.counters, eval_start=self.eval_start, eval_end=eval_end,
                                  wall_seconds=time.monotonic() - started, resumed_from=resumed_from)
            if hasattr(self.engine, "completions_by_rank"):  # data-parallel: where this attempt's rollouts sampled
                summary["completions_by_rank"] = self.engine.completions_by_rank()
            return summary
        finally:
            self.heartbeat.stop()  # only now: the final evaluation beats too, or the watchdog would take the run
            self._close_collection()

    def _train(self) -> str:
        """Steps until the last one, or until the owner asks for a pause or a cancel; returns the outcome."""
        self.collector.start()
        self._step_mark = time.monotonic()
        while self.trainer.step < self.total_steps:
            self._check()
            batch, consumed = self.collector.collect()
            self._train_and_record(batch, consumed)
            if self.heartbeat.requested == "pause":
                return "paused"
            if self.heartbeat.requested == "cancel":
                return "cancelled"
        return "completed"

    def _close_collection(self) -> None:
        self.collector.close()
        self._tools.shutdown(wait=False, cancel_futures=True)

    def _check(self) -> None:
        """Whether this attempt may go on: raises LeaseLost or AttemptAbandoned when it may not."""
        check_attempt(run_id=self.run_id, heartbeat=self.heartbeat, stop=self.stop, step=self.trainer.step)

    # --- the stages the collectors call --------------------------------------------------------------------

    def _rollout(self, tasks: list[Task], group_size: int, tools: Executor | None = None) -> list[list[Trajectory]]:
        groups = rollout_groups(tasks, run_id=self.run_id, group_size=group_size, engine=self.engine,
                                chat=self.chat, tool_runner=self.tool_runner, tool_executor=tools or self._tools,
                                board=self.board, seed=self.config.seed, temperature=self.config.temperature)
        self.heartbeat.progressed()
        return groups

    def _grade(self, task: Task, trajectory: Trajectory) -> None:
        try:
            grade_trajectory(self.verifier, task, trajectory)
            self.heartbeat.progressed()
        finally:
            self.board.finish(trajectory.id)

    def _select(self, group: Group, consumed: list[Group]) -> list[Trajectory] | None:
        """What the trainer does with a verified group: the trajectories to train on, or None (kept in
        `consumed` for the archive either way)."""
        consumed.append(group)
        usable = [t for t in group.trajectories if t.status != TrajectoryStatus.INFRA_ERROR]
        for t in group.trajectories:
            t.effective = False
        if len(usable) < 2:
            return None
        if self.scheduler.curriculum is not None:
            self.scheduler.curriculum.observe(ScheduledTask(group.task.domain, group.task.template.key,
                                                            group.task.item.key), [t.reward for t in usable])
        if too_stale(usable, version=self.trainer.step, max_staleness=self.config.max_staleness):
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

    def _train_and_record(self, batch: Batch, consumed: list[Group]) -> None:
        """Train on the batch, hand the engine the new weights, archive the step. A step's active time runs from
        the end of the previous step's update to the end of this one's, so the previous step's bookkeeping
        (archive, checkpoint) is in it, as idle time of its own."""
        version_before = self.trainer.step
        idle = self.board.drain()
        stats = self.trainer.train(batch)
        sync_started = time.monotonic()
        self._hand_weights()
        idle["weight_sync"] = time.monotonic() - sync_started
        idle["archive"], self._bookkeeping_seconds = self._bookkeeping_seconds, 0.0
        self.collector.trained()
        step = self.trainer.step
        trained = [t for group in batch for t in group]
        trained_tokens = max(1, sum(t.completion_tokens for t in trained))
        all_trajectories = [t for group in consumed for t in group.trajectories]
        for t in all_trajectories:
            t.step = step
        for t in trained:  # the update's compute, shared by the tokens it trained on
            t.costs["policy_seconds"] = (t.costs.get("policy_seconds", 0.0)
                                         + stats.seconds * t.completion_tokens / trained_tokens)
        for t in all_trajectories:
            trajectory_cost(t, self.prices)
        now = time.monotonic()
        step_seconds, self._step_mark = now - self._step_mark, now
        self.counters.active_seconds += step_seconds
        self.counters.trainer_seconds += stats.seconds
        tokens = sum(t.completion_tokens for t in all_trajectories)
        points = step_points(counters=self.counters, consumed=all_trajectories, trained=trained, stats=stats,
                             idle=idle, step_seconds=step_seconds, groups=len(consumed), effective_groups=len(batch),
                             generation_tokens_per_second=tokens / step_seconds,
                             staleness=[version_before - t.policy_version for t in trained])
        self._check()
        self.tracker.step(step=step, wall_time=time.time(), points=points, trajectories=all_trajectories,
                          events=step_events(all_trajectories))
        self.heartbeat.progressed()
        if step % self.config.checkpoint_every == 0 or step == self.total_steps:
            self._save_checkpoint()
        self.heartbeat.beat()  # asked at every step's end as well as by the heartbeat thread: a pause lands here
        give_back_free_heap_pages()  # what the step freed, back to the OS: malloc's heaps fragment (allocator.py)
        self._bookkeeping_seconds = time.monotonic() - now
        if self.progress:
            self.progress(step, self.total_steps, points)

    def _hand_weights(self) -> None:
        """The engine samples with the trainer's weights from its next batch on."""
        state = None if self.engine.shares_weights else self.policy.inference_state()
        self.engine.load_weights(state, self.trainer.step)

    def _evaluate(self) -> dict[str, float]:
        """Mean reward per domain on the run's evaluation tasks, recorded at the current step."""
        tasks = [self.tasks.task(-1 - index, template, key) for index, (template, key) in enumerate(self.eval_tasks)]
        rewards = evaluate(tasks, rollout=self._rollout, verify=self._grade,
                           rollout_concurrency=self.config.rollout_concurrency,
                           verify_concurrency=self.config.verify_concurrency)
        self.board.drain()  # evaluation is not the trainer's idle time
        if rewards:
                self.tracker.step(step=self.trainer.step, wall_time=time.time(), trajectories=[], events=[],
                              points={f"eval/reward/{domain}": reward for domain, reward in rewards.items()})
        return rewards

    # --- checkpoints -------------------------------------------------------------------------------------------

    def pipeline_state(self) -> dict:
        pending, buffer = self.collector.in_flight()
        return {"step": self.trainer.step, "next_seq": self.draws.next_seq, "scheduler": self.scheduler.state(),
                "pending": [[t.seq, t.template.key, t.item.key] for t in pending],
                "buffer": [[t.to_json() for t in group.trajectories] for group in buffer],
                "counters": self.counters.state(), "eval_start": self.eval_start}

    def _save_checkpoint(self) -> None:
        write_checkpoint(self.checkpoint_dir, step=self.trainer.step, policy=self.policy,
                         trainer_state=self.trainer.state(), pipeline_state=self.pipeline_state(),
                         keep=self.config.keep_checkpoints, tracker=self.tracker, heartbeat=self.heartbeat)
        self._last_saved = self.trainer.step

    def _restore(self) -> int | None:
        """Continue from the newest checkpoint, if there is one; returns its step. What earlier attempts archived
        after it is taken back: this attempt writes it again. The storage records which step this attempt resumed
        from, which fences off what older attempts still write (training/checkpoint.py)."""
        checkpoint = resume_checkpoint(self.checkpoint_dir, attempt=self.tracker.attempt)
        if checkpoint is None:
            self.tracker.rollback(0)
            return None
        trainer_state, state = load_checkpoint(checkpoint, policy=self.policy, device=self.policy.device)
        self.trainer.restore(trainer_state)
        self.scheduler.restore(state["scheduler"])
        self.draws.next_seq = state["next_seq"]
        self.draws.leftover.extend(self.tasks.task(seq, template, key) for seq, template, key in state["pending"])
        groups = []
        for data in state["buffer"]:
            trajectories = [Trajectory.from_json(t) for t in data]
            first = trajectories[0]
            groups.append(Group(self.tasks.task(first.seq, first.template, first.task_key), trajectories))
        self.collector.restore(groups)
        self.counters = RunCounters.from_state(state["counters"])
        self.eval_start = state.get("eval_start", {})
        self._last_saved = checkpoint.step
        self.tracker.rollback(checkpoint.step)
        self.tracker.event("resumed", f"resumed from the checkpoint at step {checkpoint.step}: "
                                      f"{len(self.draws.leftover)} draw(s) to roll out again, {len(groups)} verified "
                                      "group(s) restored", step=checkpoint.step)
        return checkpoint.step

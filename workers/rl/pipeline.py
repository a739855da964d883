"""The GRPO training pipeline: draw tasks → roll out (tool calls in the sandbox pool) → grade → train → archive.

`Pipeline` is GRPO's training loop (training/loop.py: restore → (check, step, record, checkpoint) until the last step,
a pause or a stop → summary, with the checks, the heartbeat and the checkpoints every algorithm shares). Its own part:
evaluate at the start of a run and at the end of a completed one, and its step — collect a step's groups, train on
them, hand the engine the new weights, archive every consumed trajectory with the step that consumed it.
Collection is a collector's job (rollout/collectors.py: async with bounded staleness, or sync); grading is
rollout/grading.py's; where the numbers go is the tracker's (training/tracking.py). A checkpoint keeps, beside the
weights, the scheduler, the draws in flight (rolled out again on resume) and the verified groups not trained on yet.
Built in one place: workers/rl/session.py.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor, ThreadPoolExecutor
from pathlib import Path

from workers.storage import Storage

from .config import GRPOConfig
from .protocols import ChatFormat, Engine, Policy, ToolRunner, Tracker, Verifier
from .rollout.agent import rollout_groups
from .rollout.collectors import Draws, Group, collector_for, too_stale
from .rollout.evaluation import evaluate
from .rollout.feedback import repair_points
from .rollout.grading import grade_trajectory
from .rollout.idle import PhaseBoard
from .rollout.metrics import (
    Prices,
    RunCounters,
    run_summary,
    step_events,
    step_points,
    token_staleness,
    trajectory_cost,
)
from .tasks.scheduler import ScheduledTask, Scheduler
from .tasks.taskset import TaskSet
from .training.loop import COMPLETED, StepRecord, TrainingLoop
from .training.trainer import GRPOTrainer, assign_advantages
from .types import Task, Trajectory, TrajectoryStatus


class Pipeline(TrainingLoop):
    def __init__(self, *, run_id: str, config: GRPOConfig, total_steps: int, tasks: TaskSet, scheduler: Scheduler,
                 engine: Engine, chat: ChatFormat, policy: Policy, trainer: GRPOTrainer, tool_runner: ToolRunner,
                 verifier: Verifier, tracker: Tracker, checkpoint_dir: Path | Storage, prices: Prices,
                 eval_tasks: list[tuple[str, str]], progress: Callable | None = None,
                 stop: threading.Event | None = None, stuck_after: float | None = None):
        super().__init__(run_id=run_id, config=config, total_steps=total_steps, policy=policy, trainer=trainer,
                         counters=RunCounters(), tracker=tracker, checkpoint_dir=checkpoint_dir, progress=progress,
                         stop=stop, stuck_after=stuck_after)
        self.tasks, self.scheduler, self.engine, self.chat = tasks, scheduler, engine, chat
        self.tool_runner, self.verifier, self.prices = tool_runner, verifier, prices
        self.eval_tasks = eval_tasks  # [(template key, task key)], fixed for the run
        self.eval_start: dict[str, float] = {}
        self.eval_end: dict[str, float] = {}
        self.board = PhaseBoard()
        self._tools = ThreadPoolExecutor(max_workers=max(4, config.rollout_concurrency * 2),
                                         thread_name_prefix="rl-tools")
        self.draws = Draws(scheduler, tasks, batch=config.groups_per_step)
        self.collector = collector_for(config, draws=self.draws, rollout=self._rollout, verify=self._grade,
                                       select=self._select, board=self.board, check=self.check)
        self._step_mark = 0.0  # when the previous step's update ended

    # --- the loop's hooks ----------------------------------------------------------------------------------------

    def started(self, resumed_from: int | None) -> None:
        self._hand_weights()
        if resumed_from is None and self.eval_tasks:
            self.eval_start = self._evaluate()
            self.check()
        self.collector.start()
        self._step_mark = time.monotonic()

    def ended(self, outcome: str) -> None:
        self.close()
        if outcome == COMPLETED and self.eval_tasks:
            self.eval_end = self._evaluate()

    def close(self) -> None:
        self.collector.close()
        self._tools.shutdown(wait=False, cancel_futures=True)

    def summary_fields(self, outcome: str) -> dict:
        summary = run_summary(mode=self.config.mode, max_staleness=self.config.max_staleness, counters=self.counters,
                              eval_start=self.eval_start, eval_end=self.eval_end)
        set_aside = self.scheduler.set_aside()
        # How the curriculum left the mix: at hundreds of domains, most are beyond (or beneath) the model.
        summary["curriculum"] = {"domains": len(self.scheduler.domains),
                                 **{f"set_aside_{k}": len(v) for k, v in set_aside.items()},
                                 "set_aside": set_aside}
        if hasattr(self.engine, "completions_by_rank"):  # data-parallel: where this attempt's rollouts sampled
            summary["completions_by_rank"] = self.engine.completions_by_rank()
        return summary

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
        if too_stale(usable, version=self.trainer.step, max_staleness=self.config.max_staleness,
                     per_token=self.trainer.oldest_trained_version() is not None):
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

    def train_step(self) -> StepRecord:
        """Collect a step's groups, train on them, hand the engine the new weights. A step's active time runs from
        the end of the previous step's update to the end of this one's, so the previous step's bookkeeping
        (archive, checkpoint) is in it, as idle time of its own."""
        batch, consumed = self.collector.collect()
        version_before, oldest_version = self.trainer.step, self.trainer.oldest_trained_version()
        idle = self.board.drain()
        stats = self.trainer.train(batch)
        sync_started = time.monotonic()
        self._hand_weights()
        idle["weight_sync"] = time.monotonic() - sync_started
        idle["archive"] = self.record_seconds
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
        staleness, by_staleness = token_staleness(trained, version=version_before, oldest_version=oldest_version,
                                                  max_staleness=self.config.max_staleness)
        points = step_points(counters=self.counters, consumed=all_trajectories, trained=trained, stats=stats,
                             idle=idle, step_seconds=step_seconds, groups=len(consumed), effective_groups=len(batch),
                             generation_tokens_per_second=tokens / step_seconds, staleness=staleness,
                             tokens_by_staleness=by_staleness)
        return StepRecord(points, all_trajectories, step_events(all_trajectories))

    def _hand_weights(self) -> None:
        """The engine samples with the trainer's weights from its next batch on."""
        state = None if self.engine.shares_weights else self.policy.inference_state()
        self.engine.load_weights(state, self.trainer.step)

    def _evaluate(self) -> dict[str, float]:
        """Mean reward per domain on the run's evaluation tasks, recorded at the current step."""
        tasks = [self.tasks.task(-1 - index, template, key) for index, (template, key) in enumerate(self.eval_tasks)]
        rewards, trajectories = evaluate(tasks, rollout=self._rollout, verify=self._grade,
                                         rollout_concurrency=self.config.rollout_concurrency,
                                         verify_concurrency=self.config.verify_concurrency)
        self.board.drain()  # evaluation is not the trainer's idle time
        if rewards:
            self.tracker.step(step=self.trainer.step, wall_time=time.time(), trajectories=[], events=[],
                              points={**{f"eval/reward/{domain}": reward for domain, reward in rewards.items()},
                                      **repair_points(trajectories, prefix="eval/")})
        return rewards

    # --- checkpoints -------------------------------------------------------------------------------------------

    def loop_state(self) -> dict:
        pending, buffer = self.collector.in_flight()
        return {"next_seq": self.draws.next_seq, "scheduler": self.scheduler.state(),
                "pending": [[t.seq, t.template.key, t.item.key] for t in pending],
                "buffer": [[t.to_json() for t in group.trajectories] for group in buffer],
                "eval_start": self.eval_start}

    def restore_state(self, state: dict) -> str:
        self.scheduler.restore(state["scheduler"])
        self.draws.next_seq = state["next_seq"]
        self.draws.leftover.extend(self.tasks.task(seq, template, key) for seq, template, key in state["pending"])
        groups = []
        for data in state["buffer"]:
            trajectories = [Trajectory.from_json(t) for t in data]
            first = trajectories[0]
            groups.append(Group(self.tasks.task(first.seq, first.template, first.task_key), trajectories))
        self.collector.restore(groups)
        self.eval_start = state.get("eval_start", {})
        return f"{len(self.draws.leftover)} draw(s) to roll out again, {len(groups)} verified group(s) restored"

"""One place that assembles a training session: the pipeline and the parts it owns, from a run's config,
its tasks, its model and the runners it is given.

Used by the studio's run attempt (apps/runs/attempts/), the tests and the benchmarks alike: what differs
between them is what they pass in (a database tracker or a memory one; tool calls and verification here or on
other workers), never how the engine is put together.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

from .config import GRPOConfig, SFTConfig
from .pipeline import Pipeline
from .protocols import Model, ToolRunner, Tracker, Verifier
from .rollout.metrics import Prices
from .tasks.scheduler import Curriculum, Scheduler
from .tasks.taskset import TaskSet
from .training.data_files import read_dataset
from .training.distributed import rollout_engine, trainer_for
from .training.supervised_pipeline import SupervisedPipeline


def build_pipeline(*, run_id: str, config: GRPOConfig, total_steps: int, tasks: TaskSet, model: Model,
                   tool_runner: ToolRunner, verifier: Verifier, tracker: Tracker, checkpoint_dir: Path,
                   prices: Prices | None = None, progress: Callable | None = None,
                   stop: threading.Event | None = None, stuck_after: float | None = None) -> Pipeline:
    """The pipeline of one attempt at a run. `tool_runner` runs the policy's tool calls and `verifier` grades
    its answers (here or on other workers); `tracker` receives what the run reports. Under torchrun (rank 0
    of a process group: distributed.setup) its trainer is data-parallel with the other ranks, and they generate
    with it when its engine is one of the studio's own. `stop` (set when the process was asked to stop) ends the
    run interrupted at its last finished step, checkpointed; `stuck_after` (seconds without progress) abandons the
    attempt, leaving the run to be resumed (training/loop.py)."""
    if model.engine.shares_weights and config.mode != "sync":
        raise ValueError("an engine that samples from the trainer's own model needs a sync run: an async one "
                         "trains while rollouts sample")
    scheduler = Scheduler(tasks.domains, seed=config.seed, curriculum=Curriculum() if config.curriculum else None,
                          category_quotas=config.category_quotas)
    trainer = trainer_for(model.policy, config=config, total_steps=total_steps, engine=model.engine)
    return Pipeline(
        run_id=run_id, config=config, total_steps=total_steps, tasks=tasks, scheduler=scheduler,
        engine=rollout_engine(trainer, model.engine), chat=model.chat, policy=model.policy,
        trainer=trainer, tool_runner=tool_runner,
        verifier=verifier, tracker=tracker, checkpoint_dir=checkpoint_dir, prices=prices or Prices(),
        eval_tasks=tasks.eval_tasks(per_domain=config.eval_tasks_per_domain, seed=config.seed), progress=progress,
        stop=stop, stuck_after=stuck_after)


def build_supervised_pipeline(*, run_id: str, kind: str, config: SFTConfig, total_steps: int, model: Model,
                              tracker: Tracker, checkpoint_dir: Path, progress: Callable | None = None,
                              stop: threading.Event | None = None,
                              stuck_after: float | None = None) -> SupervisedPipeline:
    """The pipeline of one attempt at an SFT or DPO run (`kind`): the rows of the dataset the config names (its
    pinned sha256 checked), trained on with the model's policy and chat format; its engine samples nothing."""
    rows = read_dataset(config.dataset_file, kind, sha256=config.dataset_sha256)
    return SupervisedPipeline(run_id=run_id, kind=kind, config=config, total_steps=total_steps, rows=rows,
                              policy=model.policy, chat=model.chat, tracker=tracker, checkpoint_dir=checkpoint_dir,
                              progress=progress, stop=stop, stuck_after=stuck_after)

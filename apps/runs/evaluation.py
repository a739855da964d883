"""An evaluation as a run: an eval suite's tasks answered by a model — a base model, a run's checkpoint, or an
OpenAI-compatible endpoint — through the real sandboxes and verifiers, archived batch by batch as the run's
steps (so the pages show its progress and replay every answer, and an attempt that dies resumes after the last
batch it archived). Nothing is trained. apps/evals launches these runs and reads their trajectories.
"""

from __future__ import annotations

import os
import time

from apps.common import wiring
from apps.registry.pins import bundle_tasks
from apps.registry.refs import parse_ref
from apps.registry.selectors import version_resolve
from workers.rl.config import RunConfig
from workers.rl.evaluation import BATCH_TASKS, evaluate_batch, suite_tasks
from workers.rl.taskset import TaskSet

from . import services
from .attempt import DatabaseTracker, fail_attempt
from .models import Run, RunStatus


def model_tasks(run: Run, config: RunConfig, suite: TaskSet) -> TaskSet:
    """The tasks the evaluated model is built from: those of the bundle it trains on (the plan's pretrained_on: a
    checkpoint's run's, or the bundle whose runs start from the base model), as a training run builds it. A base
    model the studio pretrains from a bundle's tasks (the built-in demo model) built from the suite's would have
    seen the answers it is scored on, and would not be the model those runs start from."""
    ref = config.evaluation.get("pretrained_on")
    if not ref:
        return suite
    return bundle_tasks(bundle=version_resolve(project=run.project, ref=parse_ref(ref)),
                        config=RunConfig.from_dict(RunConfig.resolve({})))  # the tasks do not depend on the settings


def evaluation_engine(config: RunConfig, tasks: TaskSet):
    """(engine, chat, model or None) answering for the evaluation: an endpoint's client, or the model at the
    checkpoint it names (the base model without one), built from `tasks` (model_tasks). The caller closes what it
    gets."""
    plan = config.evaluation
    endpoint = plan.get("endpoint")
    if endpoint:
        from workers.rl.engines.endpoint import EndpointEngine, MessagesChat

        # The key is read where the work runs, from the variable the endpoint names: never stored in the studio.
        engine = EndpointEngine(base_url=endpoint["base_url"], model=endpoint["model"],
                                api_key=os.environ.get(endpoint.get("api_key_env") or "", ""),
                                max_concurrency=config.rollout_concurrency)
        return engine, MessagesChat(), None
    model = wiring.run_model(config, tasks)
    if plan.get("checkpoint"):
        checkpoint_weights(model, plan["checkpoint"], plan.get("checkpoint_step", 0))
    return model.engine, model.chat, model


def checkpoint_model(checkpoint):
    """The model of a run at one of its checkpoints (what `serve --checkpoint` serves); the caller closes it."""
    config = RunConfig.from_dict({**checkpoint.run.config, "mode": "sync"})  # no weight copy: nothing trains
    model = wiring.run_model(config, bundle_tasks(bundle=checkpoint.run.bundle, config=config))
    try:
        checkpoint_weights(model, checkpoint.path, checkpoint.step)
    except Exception:
        model.close()
        raise
    return model


def checkpoint_weights(model, location: str, step: int) -> None:
    """The model's policy and engine at a run's checkpoint (its model.safetensors), wherever the checkpoint row
    says it is: a local directory, or the object store (read through this host's cache)."""
    path = wiring.stored_directory(location)
    if not (path / "model.safetensors").is_file():
        raise FileNotFoundError(f"checkpoint {location} has no model.safetensors: it was removed or never written")
    model.policy.restore(path / "model.safetensors")
    model.engine.load_weights(None if model.engine.shares_weights else model.policy.inference_state(), step)


def evaluation_run(*, run_id, attempt: int) -> dict:
    run = Run.objects.select_related("bundle").get(pk=run_id)
    config = RunConfig.from_dict(run.config)
    plan = config.evaluation
    pool = model = engine = None
    try:
        tasks = bundle_tasks(bundle=run.bundle, config=config)
        chosen = suite_tasks(tasks, per_template=plan.get("tasks_per_template", 0), seed=plan.get("seed", 0))
        engine, chat, model = evaluation_engine(config, model_tasks(run, config, tasks))
        pool = wiring.sandbox_pool()
        for template in tasks.templates.values():
            pool.warm(template.image)
        tool_runner, verifier = wiring.local_runners(pool, config)
        tracker = DatabaseTracker(run.pk, attempt)
        batches = [chosen[start:start + BATCH_TASKS] for start in range(0, len(chosen), BATCH_TASKS)]
        for step, batch in enumerate(batches, start=1):
            if step <= run.step:
                continue  # archived by an earlier attempt
            if tracker.heartbeat() == "cancel":
                summary = {"run": str(run.pk), "outcome": "cancelled", "kind": "evaluation", "batches": step - 1}
                tracker.finish(status=RunStatus.CANCELLED, summary=summary)
                return summary
            trajectories = evaluate_batch(
                batch, run_id=str(run.pk), step=step, engine=engine, chat=chat, tool_runner=tool_runner,
                verifier=verifier, prices=wiring.prices(), samples=plan.get("samples_per_task", 1),
                temperature=plan.get("temperature", 0.0), seed=plan.get("seed", 0),
                rollout_concurrency=config.rollout_concurrency, verify_concurrency=config.verify_concurrency)
            graded = [t for t in trajectories if t.reward is not None]
            points = {"eval/done_tasks": float(min(len(chosen), step * BATCH_TASKS)),
                      "eval/infra_errors": float(len(trajectories) - len(graded))}
            if graded:
                points["reward/mean"] = sum(t.reward for t in graded) / len(graded)
            tracker.step(step=step, wall_time=time.time(), points=points, trajectories=trajectories, events=[])
        summary = {"run": str(run.pk), "outcome": "completed", "kind": "evaluation", "tasks": len(chosen),
                   "samples_per_task": plan.get("samples_per_task", 1)}
        tracker.finish(status=RunStatus.COMPLETED, summary=summary)
        return summary
    except services.RunLeaseLost:
        return {}
    except Exception as exc:
        fail_attempt(run.pk, attempt, f"{type(exc).__name__}: {exc}")
        raise
    finally:
        if model is not None:
            model.close()
        elif engine is not None:
            engine.close()
        if pool is not None:
            pool.close()

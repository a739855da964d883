"""An evaluation's attempt: an eval suite's tasks answered by a model — a base model, a run's checkpoint, or an
OpenAI-compatible endpoint — through the real sandboxes and verifiers, archived batch by batch as the run's
steps (so the pages show its progress and replay every answer, and an attempt that stops resumes after the last
batch it archived). Nothing is trained. apps/evals launches these runs and reads their trajectories.
"""

from __future__ import annotations

import time

from apps.accounts.credentials import CredentialRefused, credential_value
from apps.common import wiring
from apps.registry.pins import bundle_tasks
from apps.registry.refs import parse_ref
from apps.registry.selectors import version_resolve
from workers.rl.config import EvaluationConfig, EvaluationPlan, RolloutConfig
from workers.rl.rollout.evaluation import BATCH_TASKS, evaluate_batch, suite_tasks
from workers.rl.rollout.feedback import repair_points
from workers.rl.tasks.taskset import TaskSet

from ..dataset_pins import dataset_here
from ..models import Run
from .base import Attempt


class EvaluationAttempt(Attempt):
    reports_progress = True  # a batch archived

    def execute(self) -> dict:
        run, config = self.run, self.config
        plan = config.evaluation_plan
        tasks = bundle_tasks(bundle=run.bundle)
        chosen = suite_tasks(tasks, per_template=plan.tasks_per_template, seed=plan.seed)
        engine, chat = evaluation_engine(config, model_tasks(run, plan, tasks), opened=self.closing,
                                         project=run.project)
        pool = self.closing(wiring.sandbox_pool())
        for template in tasks.templates.values():
            pool.warm(template.image)
        tool_runner, verifier = wiring.local_runners(pool, config)
        batches = [chosen[start:start + BATCH_TASKS] for start in range(0, len(chosen), BATCH_TASKS)]
        for step, batch in enumerate(batches, start=1):
            if step <= run.step:
                continue  # archived by an earlier attempt
            if self.stop_asked:  # the next start goes on after the batches archived
                return {"run": str(run.pk), "outcome": "interrupted", "kind": "evaluation", "batches": step - 1}
            self.check()
            if self.heartbeat.beat() == "cancel":
                return {"run": str(run.pk), "outcome": "cancelled", "kind": "evaluation", "batches": step - 1}
            trajectories = evaluate_batch(
                batch, run_id=str(run.pk), step=step, engine=engine, chat=chat, tool_runner=tool_runner,
                verifier=verifier, prices=wiring.prices(), samples=plan.samples_per_task,
                temperature=plan.temperature, seed=plan.seed,
                rollout_concurrency=config.rollout_concurrency, verify_concurrency=config.verify_concurrency)
            graded = [t for t in trajectories if t.reward is not None]
            points = {"eval/done_tasks": float(min(len(chosen), step * BATCH_TASKS)),
                      "eval/infra_errors": float(len(trajectories) - len(graded))}
            if graded:
                points["reward/mean"] = sum(t.reward for t in graded) / len(graded)
            points.update(repair_points(graded))  # the batch's solved repair trajectories fixed after feedback
            self.tracker.step(step=step, wall_time=time.time(), points=points, trajectories=trajectories, events=[])
            self.heartbeat.progressed()
        return {"run": str(run.pk), "outcome": "completed", "kind": "evaluation", "tasks": len(chosen),
                "samples_per_task": plan.samples_per_task}


def model_tasks(run: Run, plan: EvaluationPlan, suite: TaskSet) -> TaskSet:
    """The tasks the evaluated model is built from: those of the bundle it trains on (the plan's pretrained_on: a
    checkpoint's run's, or the bundle whose runs start from the base model), as a training run builds it. A base
    model the studio pretrains from a bundle's tasks (the built-in demo model) built from the suite's would have
    seen the answers it is scored on, and would not be the model those runs start from."""
    if not plan.pretrained_on:
        return suite
    return bundle_tasks(bundle=version_resolve(project=run.project, ref=parse_ref(plan.pretrained_on)))


def evaluation_engine(config: EvaluationConfig, tasks: TaskSet, *, opened, project):
    """(engine, chat) answering for the evaluation: an endpoint's client, or the model at the checkpoint the plan
    names (the base model without one), built from `tasks` (model_tasks). What it opens goes to `opened`, which
    closes it when the attempt ends. An endpoint's address and credential are checked again here, before any
    request: the policy or the credentials may have changed since the launch, and plans pinned before credentials
    name an environment variable (refused: it could be any of the studio's secrets)."""
    plan = config.evaluation_plan
    if plan.endpoint is not None:
        from workers.rl.engines.endpoint import EndpointEngine, MessagesChat

        if plan.endpoint.api_key_env:
            raise CredentialRefused(
                f"this evaluation's endpoint was to send the environment variable {plan.endpoint.api_key_env} as "
                "its API key, which endpoints may no longer name (it could be one of the studio's own secrets); "
                "nothing was sent. Pick the endpoint's credential on the evals page (or PATCH its credential "
                "through the API) and launch the evaluation again")
        # The key is read where the work runs, from the credential the endpoint names; the address is checked by
        # the engine (EgressRefused) before it sends anything.
        engine = opened(EndpointEngine(base_url=plan.endpoint.base_url, model=plan.endpoint.model,
                                       api_key=credential_value(project=project, credential=plan.endpoint.credential),
                                       max_concurrency=config.rollout_concurrency, egress=wiring.egress_policy()))
        return engine, MessagesChat()
    model = opened(wiring.run_model(config, tasks))
    if plan.checkpoint:
        checkpoint_weights(model, plan.checkpoint, plan.checkpoint_step)
    return model.engine, model.chat


def checkpoint_model(checkpoint, *, overrides: dict | None = None):
    """The model of a run at one of its checkpoints (what `serve --checkpoint` serves); the caller closes it.
    `overrides`: rollout settings that replace the run's (serve's --speculative-tokens)."""
    source = checkpoint.run
    # The run's model, sampled as an evaluation samples one: sync, so no copy of the weights (nothing trains).
    config = RolloutConfig.from_dict({**source.config, "mode": "sync", **(overrides or {})})
    tasks = bundle_tasks(bundle=source.bundle) if source.bundle is not None else None
    # An SFT or DPO run on a dataset alone: its base model was pretrained on the dataset's conversations.
    dataset_file = "" if tasks is not None else dataset_here(project=source.project,
                                                             config=source.run_config).dataset_file
    model = wiring.run_model(config, tasks, dataset_file=dataset_file)
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

"""Writes for runs. Each is one transaction; the owner's actions leave an audit row, workers' writes are fenced.

Fencing: `run_claim` bumps `Run.attempt` and hands the new number to the worker; every later write names it
and is refused with RunLeaseLost once another claim has happened. Live updates are broadcast after the
transaction commits (live.py), never before, so a page never shows what a rollback took back.
"""

from __future__ import annotations

import logging
import socket
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

from django.db import transaction
from django.utils import timezone

from apps.accounts.models import Project
from apps.accounts.services import audit_record
from apps.common import wiring
from apps.common.errors import FieldError, StudioError
from apps.registry.errors import VersionNotFound
from apps.registry.models import Version
from apps.registry.refs import parse_ref
from apps.registry.selectors import version_resolve
from workers.rl.config import (
    SET_BY_THE_STUDIO,
    ConfigError,
    GRPOConfig,
    PolicyConfig,
    SFTConfig,
    config_class,
    config_hash,
)
from workers.rl.models.weights import source_model
from workers.rl.types import Trajectory

from . import live
from .dataset_pins import DatasetRefused, dataset_pin
from .dispatch import run_enqueue
from .models import (
    ACTIVE_STATUSES,
    CLAIMABLE_STATUSES,
    DATASET_KINDS,
    FINISHED_STATUSES,
    STUDIO_RUN_KINDS,
    Checkpoint,
    EventKind,
    MetricPoint,
    Run,
    RunEvent,
    RunKind,
    RunRequest,
    RunStatus,
)
from .signals import trajectories_archived
from .stages import start_keep, start_pinned

log = logging.getLogger(__name__)


class RunError(StudioError, ValueError):
    """A request that does not fit the run's state, in words for the person who made it: 400, or 409 where the
    run's state refuses it; a config's problems each name their field."""


class RunLeaseLost(Exception):
    """This worker's attempt is no longer the run's current one: stop without writing anything more."""


def worker_name() -> str:
    import os

    return f"{socket.gethostname()}:{os.getpid()}"


def run_create(*, project: Project, bundle: Version | None, steps: int, overrides: dict | None = None, name: str = "",
               kind: str = RunKind.GRPO, actor=None, via: str = "web", pinned: dict | None = None,
               enqueue: bool = False) -> Run:
    """A queued run of `kind` pinned to `bundle` (an exact bundle version; None for an SFT or DPO run on its dataset
    alone, whose settings are then the defaults and `overrides`) and its config, resolved once
    (run_config_resolve). `pinned` holds settings only the studio sets (an evaluation's plan, the model of the
    checkpoint it evaluates): callers pass them from what they resolved themselves, never from a request. With
    `enqueue`, it is handed to whatever runs queued runs once the transaction commits (dispatch.run_enqueue);
    without, the caller runs it itself (`train --headless`) or leaves it queued."""
    if not isinstance(steps, int) or steps < 1:
        raise RunError(f"steps must be a whole number of at least 1, not {steps!r}")
    config, hashed = run_config_resolve(project=project, bundle=bundle, kind=kind, overrides=overrides,
                                        pinned=pinned, via=via)
    start_keep(config)  # out of its own run's retention before this run can ask for it
    with transaction.atomic():
        run = Run.objects.create(
            project=project, name=name or f"{_default_name(bundle, config, kind)}-{timezone.now():%Y%m%d-%H%M%S}",
            kind=kind, bundle=bundle, config=config, config_hash=hashed,
            steps_total=steps, created_by=actor if getattr(actor, "is_authenticated", False) else None)
        _event(run, EventKind.CREATED, f"created: {steps} steps on {run.trained_on}",
               details={"config": overrides or {}})
        audit_record(project=project, actor=actor, action="run.create", target=f"run/{run.id}",
                     details={"bundle": bundle.ref if bundle else None, "dataset": config.get("dataset") or None,
                              "steps": steps, "config_hash": run.config_hash}, via=via)
        if enqueue:
            run_enqueue(run)
    return run


def run_config_resolve(*, project: Project, bundle: Version | None, kind: str = RunKind.GRPO,
                       overrides: dict | None = None, pinned: dict | None = None, via: str = "web") -> tuple[dict, str]:
    """The config a run of `kind` on `bundle` (None: an SFT or DPO run on its dataset alone) with `overrides` stores,
    and its config hash, or RunError with each problem at its field: what run_create stores, resolved once, so a
    page can show both before anything is queued (the run form's review step).

    The kind's config class (workers/rl/config.py) resolves, in this order: the bundle's run_config (the settings
    of this kind it names: a bundle recommends settings to runs of every kind), the overrides (a setting of another
    kind is refused by name), the model definition's or the starting checkpoint's pins, then `pinned`. An SFT or
    DPO run's dataset is pinned after (its file and sha256; the rows read and checked): from the command line
    (`via` cli) a file's path may name it, elsewhere a dataset version only."""
    if bundle is not None and (bundle.definition.kind != "bundle" or bundle.definition.project_id != project.pk):
        raise RunError(f"{bundle.ref} is not a bundle of project {project.slug}")
    if bundle is None and kind not in DATASET_KINDS:
        raise RunError(f"a {kind} run needs a bundle (its tasks); only SFT and DPO runs train on a dataset alone",
                       errors=[FieldError("bundle", "required")])
    studio_set = sorted(set(overrides or {}) & set(SET_BY_THE_STUDIO))
    if studio_set:
        raise RunError(f"config: {', '.join(studio_set)}: set by the studio from the model definition; "
                       "name the model (model/SLUG) instead")
    kind_config = config_class(kind)
    try:
        recommended = kind_config.own(bundle.spec.get("run_config", {})) if bundle is not None else {}
        config = kind_config.resolve({**_model_pinned(start_pinned({**recommended, **(overrides or {})},
                                                                   project=project),
                                                      project=project, bundle=bundle), **(pinned or {})})
    except ConfigError as exc:
        raise _config_refused(exc.errors) from None
    if kind == RunKind.EVALUATION and not config.evaluation:
        raise RunError("an evaluation is launched from its eval suite (apps/evals), with its plan")
    if isinstance(config, PolicyConfig):
        problem = wiring.model_problem(config.model)
        if problem:
            raise RunError(f"config: {problem}", errors=[FieldError("model", problem)])
    if isinstance(config, GRPOConfig):
        problem = wiring.inference_servers_problem(config.server_urls())
        if problem:
            raise _config_refused([FieldError("inference_servers", problem)])
    if isinstance(config, SFTConfig):
        try:
            config = replace(config, **dataset_pin(project=project, dataset=config.dataset, kind=kind, via=via))
        except DatasetRefused as exc:
            raise _config_refused(exc.errors) from None
    stored = config.to_dict()
    return stored, config_hash(bundle_hash=bundle.content_hash if bundle is not None else "", config=stored)


def _default_name(bundle: Version | None, config: dict, kind: str) -> str:
    """A new run's name before its time stamp: its bundle's slug, or for a dataset run alone its kind and the
    dataset's name (dataset/SLUG@N or the file's stem)."""
    if bundle is not None:
        return bundle.definition.slug
    dataset = config["dataset"]
    stem = dataset.removeprefix("dataset/").partition("@")[0] if dataset.startswith("dataset/") else \
        Path(dataset).stem
    return f"{kind}-{stem}"


def _config_refused(errors: list[FieldError]) -> RunError:
    """A config a run cannot take: `config: field: problem; ...`, each problem naming its field."""
    return RunError("config: " + "; ".join(map(str, errors)), errors=errors)


def _model_pinned(settings: dict, *, project: Project, bundle: Version | None) -> dict:
    """Run settings whose `model` names a model definition, with the definition's source as the model and its
    exact version and weights' hash pinned (its chat template and context length fill settings the run left
    unset). The bundle's lock (if the run has a bundle) wins for a floating reference, as it does for every other
    definition."""
    model = settings.get("model")
    if not isinstance(model, str) or not model.startswith("model/"):
        return settings
    try:
        ref = parse_ref(model)
        version = version_resolve(project=project, ref=bundle.lock.pin(ref) if bundle is not None else ref)
    except VersionNotFound as exc:
        raise ConfigError([FieldError("model", str(exc))]) from None
    spec = version.spec
    pinned = {**settings, "model": source_model(spec["source"]), "model_version": version.ref,
              "model_sha256": spec["weights_sha256"]}
    if not settings.get("chat_template") and spec.get("chat_template"):
        pinned["chat_template"] = spec["chat_template"]
    if not settings.get("context_length") and spec.get("context_length"):
        pinned["context_length"] = spec["context_length"]
    return pinned


def run_request(*, run: Run, action: str, actor, via: str = "web", enqueue: bool = True) -> Run:
    """pause | resume | cancel, from the page, the API or the CLI; finish for a run trained elsewhere. A resumed run
    is queued again for a worker (dispatch.run_enqueue), unless `enqueue` is off: the caller trains it itself
    (`train --resume`)."""
    with transaction.atomic():
        run = Run.objects.select_for_update().get(pk=run.pk)
        if run.kind == RunKind.EXTERNAL:
            _external_request(run, action)
        elif action == "finish":
            raise RunError(f"only a run trained elsewhere is finished by hand; {run.name} ends after its "
                           f"{run.steps_total} steps (cancel it to stop it sooner)", status=409)
        elif action == "pause":
            if run.status == RunStatus.QUEUED:
                run.status = RunStatus.PAUSED
                _event(run, EventKind.PAUSED, "paused before a worker started it")
            elif run.status == RunStatus.RUNNING:
                run.requested = RunRequest.PAUSE
                _event(run, EventKind.REQUESTED, "pause requested: the worker checkpoints at the end of this step")
            else:
                raise RunError(f"a {run.status} run cannot be paused", status=409)
        elif action == "resume":
            if run.status not in (RunStatus.PAUSED, RunStatus.INTERRUPTED):
                raise RunError(f"only a paused or interrupted run can be resumed; this one is {run.status}",
                               status=409)
            run.status, run.requested = RunStatus.QUEUED, RunRequest.NONE
            _event(run, EventKind.REQUESTED, "resume requested: queued for a worker")
            if enqueue:
                run_enqueue(run)
        elif action == "cancel":
            if run.status in FINISHED_STATUSES:
                raise RunError(f"the run is already {run.status}", status=409)
            if run.status == RunStatus.RUNNING:
                run.requested = RunRequest.CANCEL
                _event(run, EventKind.REQUESTED, "cancel requested: the worker stops at the end of this step")
            else:
                run.status, run.finished_at = RunStatus.CANCELLED, timezone.now()
                _event(run, EventKind.CANCELLED, "cancelled")
        else:
            raise RunError(f"unknown action {action!r}; use pause, resume or cancel")
        run.save(update_fields=["status", "requested", "finished_at"])
        audit_record(project=run.project, actor=actor, action=f"run.{action}", target=f"run/{run.id}", via=via)
        live.broadcast_run(run)
    return run


def _external_request(run: Run, action: str) -> None:
    """finish or cancel a run trained elsewhere, at once: no worker of ours runs it, so there is nothing to ask to
    stop at a step's end. Its trainer's next episode is refused (external.record_episode). Pausing is the
    trainer's to do."""
    if action not in ("finish", "cancel"):
        raise RunError(f"{run.name} is trained elsewhere: the studio cannot {action} its trainer; finish the run "
                       "when its training ends (or cancel it)", status=409)
    if run.status in FINISHED_STATUSES:
        raise RunError(f"the run is already {run.status}", status=409)
    episodes = run.summary.get("episodes", 0)
    if action == "finish":
        run.status = RunStatus.COMPLETED
        _event(run, EventKind.COMPLETED, f"finished by hand after {episodes} episode(s), last trainer step "
                                         f"{run.step}: the episodes that come after are refused", step=run.step)
    else:
        run.status = RunStatus.CANCELLED
        _event(run, EventKind.CANCELLED, f"cancelled after {episodes} episode(s): the episodes that come after "
                                         "are refused", step=run.step)
    run.finished_at = timezone.now()


def run_claim(*, run_id, stale_after: float, worker: str | None = None) -> int | None:
    """Claim a queued or interrupted run, or a running one whose heartbeat is older than `stale_after` seconds (its
    worker is presumed dead). Returns the new attempt number, or None if the run is not claimable (someone has it,
    or it is not the studio's to run: trained elsewhere)."""
    now = timezone.now()
    with transaction.atomic():
        run = Run.objects.select_for_update().filter(pk=run_id, kind__in=STUDIO_RUN_KINDS).first()
        if run is None:
            return None
        stale = run.heartbeat_at is None or run.heartbeat_at < now - timedelta(seconds=stale_after)
        if not (run.status in CLAIMABLE_STATUSES or (run.status == RunStatus.RUNNING and stale)):
            return None
        if run.status == RunStatus.RUNNING:
            _event(run, EventKind.WORKER_LOST, f"worker {run.worker or '?'} stopped answering at step {run.step}; "
                                               f"taken over {_resume_point(run)}",
                   step=run.step, details={"worker": run.worker, "attempt": run.attempt})
        run.attempt += 1
        run.status, run.worker, run.heartbeat_at = RunStatus.RUNNING, worker or worker_name(), now
        run.started_at = run.started_at or now
        run.save(update_fields=["attempt", "status", "worker", "heartbeat_at", "started_at"])
        _event(run, EventKind.STARTED, f"attempt {run.attempt} on {run.worker}", attempt=run.attempt)
        live.broadcast_run(run)
        return run.attempt


def runs_requeue_lost(*, stale_after: float) -> list[Run]:
    """Runs whose worker stopped heartbeating go back to the queue, each with a worker_lost event. A run trained
    elsewhere has no worker here: its trainer going quiet is not a loss to repair."""
    cutoff = timezone.now() - timedelta(seconds=stale_after)
    requeued = []
    with transaction.atomic():
        for run in Run.objects.select_for_update().filter(status=RunStatus.RUNNING, heartbeat_at__lt=cutoff,
                                                          kind__in=STUDIO_RUN_KINDS):
            run.status = RunStatus.QUEUED
            run.save(update_fields=["status"])
            _event(run, EventKind.WORKER_LOST, f"worker {run.worker} stopped answering at step {run.step}; "
                                               f"queued {_resume_point(run)}",
                   step=run.step, details={"worker": run.worker, "attempt": run.attempt})
            live.broadcast_run(run)
            requeued.append(run)
    return requeued


def _resume_point(run: Run) -> str:
    """Where a run whose worker was lost goes on from, in words. A training run restarts from its newest
    checkpoint (workers/rl/pipeline.py), so the steps after it are trained again: the step it stopped at is not
    the step it resumes from. An evaluation goes on after the last batch it archived (attempts/evaluation.py); a
    reference check is checked again from its start."""
    if run.kind == RunKind.EVALUATION:
        return f"to resume after batch {run.step}, the last it archived"
    if run.kind == RunKind.REFERENCE:
        return "to be checked again from the start"
    newest = run.checkpoints.order_by("-step").values_list("step", flat=True).first()
    if newest is None:
        return "to resume from the start: it saved no checkpoint"
    again = "" if newest == run.step else (
        f" (step {run.step} is trained again)" if newest + 1 == run.step
        else f" (steps {newest + 1}-{run.step} are trained again)")
    return f"to resume from its checkpoint at step {newest}{again}"


def _fenced(run_id, attempt: int) -> Run:
    run = Run.objects.select_for_update().get(pk=run_id)
    if run.attempt != attempt or run.status != RunStatus.RUNNING:
        raise RunLeaseLost(f"run {run_id} is at attempt {run.attempt} ({run.status}); this worker holds {attempt}")
    return run


def run_heartbeat(*, run_id, attempt: int) -> str:
    """Proof of life; returns what the owner asked for meanwhile (pause, cancel or nothing)."""
    with transaction.atomic():
        run = _fenced(run_id, attempt)
        Run.objects.filter(pk=run.pk).update(heartbeat_at=timezone.now())
        return run.requested


def run_step_record(*, run_id, attempt: int, step: int, wall_time: float, points: dict[str, float],
                    trajectories: list[Trajectory], events: list[tuple[str, str, dict]] = ()) -> None:
    """One trainer step: its metric points, the trajectories it archived and its events, all or nothing; then,
    once committed, `trajectories_archived` for the apps that react to them (signals.py)."""
    from apps.trajectories.services import trajectories_record

    with transaction.atomic():
        run = _fenced(run_id, attempt)
        if points:
            MetricPoint.objects.bulk_create(
                [MetricPoint(run=run, name=name, step=step, wall_time=wall_time, value=float(value))
                 for name, value in points.items()],
                update_conflicts=True, unique_fields=["run", "name", "step"], update_fields=["value", "wall_time"])
        trajectories_record(run=run, attempt=attempt, trajectories=trajectories)
        if trajectories:
            archived = [t.id for t in trajectories]
            transaction.on_commit(lambda: _announce_archived(run, archived))
        for kind, message, details in events:
            _event(run, kind, message, step=step, attempt=attempt, details=details)
        Run.objects.filter(pk=run.pk).update(step=max(run.step, step), heartbeat_at=timezone.now())
        live.broadcast_step(run_id=run.pk, step=step, wall_time=wall_time, points=points,
                            events=[(kind, message) for kind, message, _ in events])


def _announce_archived(run: Run, trajectory_ids: list[str]) -> None:
    """A receiver that fails is logged, never the trainer's failure: its step is committed already."""
    for receiver, result in trajectories_archived.send_robust(sender=Run, run=run, trajectory_ids=trajectory_ids):
        if isinstance(result, Exception):
            log.error("run %s: %s failed on a step's trajectories", run.name, getattr(receiver, "__name__", receiver),
                      exc_info=result)


def run_rollback(*, run_id, attempt: int, step: int) -> None:
    """What earlier attempts archived after `step` is about to be written again by this one: take it back."""
    from apps.trajectories.models import Trajectory as ArchivedTrajectory

    with transaction.atomic():
        run = _fenced(run_id, attempt)
        MetricPoint.objects.filter(run=run, step__gt=step).delete()
        # A trajectory already in a review queue is kept, and its labels with it (deleting it would cascade to
        # people's work): this attempt writes the same id again, overwriting it in place.
        ArchivedTrajectory.objects.filter(run=run, step__gt=step).exclude(queue_items__isnull=False).delete()
        Run.objects.filter(pk=run.pk).update(step=step)


def run_checkpoint_record(*, run_id, attempt: int, step: int, path: str, size: int, removed: list[int] = ()) -> None:
    with transaction.atomic():
        run = _fenced(run_id, attempt)
        if not Checkpoint.objects.filter(run=run, step=step, kept=True).exists():  # a kept copy stays as it is
            Checkpoint.objects.update_or_create(run=run, step=step, defaults={"path": path, "bytes": size})
        # A kept checkpoint stays: its files were copied out of the run's directory (checkpoints.checkpoint_keep).
        Checkpoint.objects.filter(run=run, step__in=list(removed), kept=False).delete()
        _event(run, EventKind.CHECKPOINT_SAVED, f"checkpoint at step {step} ({size / 1e6:.1f} MB)", step=step,
               attempt=attempt, details={"path": path, "bytes": size})


def run_event_record(*, run_id, attempt: int, kind: str, message: str, step: int | None = None,
                     details: dict | None = None) -> None:
    with transaction.atomic():
        run = _fenced(run_id, attempt)
        _event(run, kind, message, step=step, attempt=attempt, details=details)


def run_finish(*, run_id, attempt: int, status: str, summary: dict | None = None, error: str = "") -> None:
    """The worker's last word: completed, paused (on request), cancelled (on request), interrupted (its process was
    asked to stop) or failed."""
    kinds = {RunStatus.COMPLETED: EventKind.COMPLETED, RunStatus.PAUSED: EventKind.PAUSED,
             RunStatus.INTERRUPTED: EventKind.INTERRUPTED, RunStatus.CANCELLED: EventKind.CANCELLED,
             RunStatus.FAILED: EventKind.FAILED}
    with transaction.atomic():
        run = _fenced(run_id, attempt)
        run.status, run.requested = status, RunRequest.NONE
        if summary is not None:
            run.summary = summary
        run.error = error
        if status in FINISHED_STATUSES:
            run.finished_at = timezone.now()
        run.save(update_fields=["status", "requested", "summary", "error", "finished_at"])
        # A paused or interrupted run resumes from a checkpoint: the training loop saves one at the last step it
        # finished, and the event says so (or which steps would be trained again, should the newest be older).
        message = {RunStatus.COMPLETED: f"completed {run.step} steps",
                   RunStatus.PAUSED: f"paused at step {run.step}, {_resume_point(run)}",
                   RunStatus.INTERRUPTED: f"interrupted at step {run.step} (its process was asked to stop), "
                                          f"{_resume_point(run)}",
                   RunStatus.CANCELLED: f"cancelled at step {run.step}"}.get(status, f"failed: {error[:500]}")
        _event(run, kinds[status], message, step=run.step, attempt=attempt)
        live.broadcast_run(run)


def _event(run: Run, kind: str, message: str, *, step: int | None = None, attempt: int | None = None,
           details: dict | None = None) -> RunEvent:
    event = RunEvent.objects.create(run=run, kind=kind, message=message, step=step,
                                    attempt=run.attempt if attempt is None else attempt, details=details or {})
    live.broadcast_event(event)
    return event


__all__ = ["ACTIVE_STATUSES", "RunError", "RunLeaseLost", "run_checkpoint_record", "run_claim", "run_create",
           "run_event_record", "run_finish", "run_heartbeat", "run_request", "run_rollback", "run_step_record",
           "runs_requeue_lost"]

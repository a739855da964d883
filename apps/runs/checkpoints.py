"""The checkpoint registry: every checkpoint a run saved, found by `RUN@STEP` or by an alias, and aliases moved
with an audit row.

Retention: a run keeps its newest `keep_checkpoints` (workers/rl/training/checkpoint.py removes older ones as it saves)
and every aliased one. An aliased checkpoint, or one queued for an evaluation, is kept: its files are copied out of
the run's checkpoint directory into `checkpoints/kept/` of the blob storage (published whole, as the run's own), and
its row outlives the run's retention (services.run_checkpoint_record leaves kept rows)."""

from __future__ import annotations

import uuid

from django.db import transaction

from apps.accounts.models import Project
from apps.accounts.services import audit_record
from apps.common import wiring
from apps.common.errors import StudioError

from .models import Checkpoint, CheckpointAlias, Run


class CheckpointNotFound(StudioError, LookupError):
    status = 404


def run_find(*, project: Project, name: str) -> Run:
    """A run of the project by its id, or by its name (the newest of that name)."""
    runs = Run.objects.filter(project=project)
    try:
        run = runs.filter(pk=uuid.UUID(name)).first()
    except ValueError:
        run = runs.filter(name=name).order_by("-created_at").first()
    if run is None:
        raise CheckpointNotFound(f"no run {name!r} in project {project.slug}")
    return run


def checkpoint_resolve(*, project: Project, name: str) -> Checkpoint:
    """`RUN@STEP` (a run's name or id; STEP a number or `latest`) or an alias of the project."""
    if "@" not in name:
        alias = CheckpointAlias.objects.filter(project=project, name=name).select_related("checkpoint__run").first()
        if alias is None:
            raise CheckpointNotFound(f"no checkpoint alias {name!r} in project {project.slug}; write RUN@STEP "
                                     "or an alias")
        return alias.checkpoint
    run_name, _, step = name.rpartition("@")
    run = run_find(project=project, name=run_name)
    saved = Checkpoint.objects.filter(run=run).select_related("run")
    found = saved.order_by("-step").first() if step == "latest" else \
        saved.filter(step=int(step)).first() if step.isdigit() else None
    if found is None:
        steps = ", ".join(str(s) for s in saved.order_by("step").values_list("step", flat=True)) or "none"
        raise CheckpointNotFound(f"run {run.name} has no checkpoint at step {step}; its checkpoints: {steps}")
    return found


def checkpoint_keep(checkpoint: Checkpoint) -> Checkpoint:
    """Copy the checkpoint's files out of the run's directory, where the run's retention would remove them, into
    `checkpoints/kept/` of the blob storage (published whole or not at all), and mark it kept."""
    if checkpoint.kept:
        return checkpoint
    storage = wiring.blob_storage()
    key = f"checkpoints/kept/{checkpoint.run_id}/step-{checkpoint.step:08d}"
    if not storage.published(key):
        try:
            files = wiring.stored_directory(checkpoint.path)
        except FileNotFoundError:
            raise CheckpointNotFound(f"the files of {checkpoint.run.name}@{checkpoint.step} are gone "
                                     f"({checkpoint.path}): the run's retention removed them") from None
        storage.publish(key, files, step=checkpoint.step, run=str(checkpoint.run_id))
    kept = storage.url_of(key)
    Checkpoint.objects.filter(pk=checkpoint.pk).update(path=kept, kept=True)
    checkpoint.path, checkpoint.kept = kept, True
    return checkpoint


def alias_move(*, project: Project, name: str, checkpoint: Checkpoint, actor, via: str = "web") -> CheckpointAlias:
    if checkpoint.run.project_id != project.pk:
        raise CheckpointNotFound(f"that checkpoint is not of project {project.slug}")
    checkpoint_keep(checkpoint)
    with transaction.atomic():
        alias = CheckpointAlias.objects.select_for_update().filter(project=project, name=name).first()
        before = None if alias is None else f"{alias.checkpoint.run.name}@{alias.checkpoint.step}"
        by = actor if getattr(actor, "is_authenticated", False) else None
        if alias is None:
            alias = CheckpointAlias.objects.create(project=project, name=name, checkpoint=checkpoint, moved_by=by)
        else:
            alias.checkpoint, alias.moved_by = checkpoint, by
            alias.save(update_fields=["checkpoint", "moved_by", "moved_at"])
        audit_record(project=project, actor=actor, action="checkpoint.alias.move", target=f"alias/{name}",
                     details={"from": before, "to": f"{checkpoint.run.name}@{checkpoint.step}",
                              "run": str(checkpoint.run_id), "step": checkpoint.step}, via=via)
    return alias

"""A training run whose config names an eval suite (eval_suite, eval_suite_every) has its checkpoints evaluated
on it: the evaluation is queued once the checkpoint's row is committed."""

from __future__ import annotations

import logging

from django.db import transaction
from django.db.models.signals import post_save
from django.dispatch import receiver

from apps.registry.errors import VersionNotFound
from apps.registry.refs import Ref
from apps.registry.selectors import version_resolve
from apps.runs.models import TRAINING_KINDS, Checkpoint

from .services import EvalError, evaluation_launch

log = logging.getLogger(__name__)


def due(checkpoint: Checkpoint) -> bool:
    if checkpoint.run.kind not in TRAINING_KINDS:
        return False
    config = checkpoint.run.run_config
    if not config.eval_suite:
        return False
    every = config.eval_suite_every
    return checkpoint.step == checkpoint.run.steps_total or bool(every and checkpoint.step % every == 0)


@receiver(post_save, sender=Checkpoint, dispatch_uid="evals.checkpoint_saved")
def checkpoint_saved(sender, instance: Checkpoint, created: bool, **_) -> None:
    if created and due(instance):
        transaction.on_commit(lambda: _evaluate(instance.pk))


def _evaluate(checkpoint_id: int) -> None:
    checkpoint = Checkpoint.objects.select_related("run__project").filter(pk=checkpoint_id).first()
    if checkpoint is None:
        return
    run = checkpoint.run
    try:
        suite = version_resolve(project=run.project, ref=Ref("bundle", run.config["eval_suite"]))
        evaluation_launch(project=run.project, suite=suite, actor=None, checkpoint=checkpoint, via="studio")
    except (VersionNotFound, EvalError) as exc:  # the run goes on: an evaluation is never the run's failure
        log.warning("run %s: checkpoint %s not evaluated on %s: %s", run.name, checkpoint.step,
                    run.config["eval_suite"], exc)

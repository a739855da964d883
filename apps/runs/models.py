"""Training runs: what a run pins, where it stands, its checkpoints, metric points and events.

A Run pins a bundle version (which pins every definition version it needs) and its resolved config, hashed
together; an SFT or DPO run may pin a dataset alone (its config pins the dataset's hash). Workers claim a run for
an *attempt* (a fencing token): every write from a worker names its attempt, and a write from an attempt that is
no longer current (a worker presumed dead that comes back) is refused. So a run resumed elsewhere never gets a
second writer.
"""

import uuid

from django.conf import settings
from django.db import models

from apps.accounts.models import Project
from apps.registry.models import Version
from workers.rl.config import RunConfig, config_class


class RunStatus(models.TextChoices):
    QUEUED = "queued"  # waiting for a worker (new, resumed, or requeued after its worker was lost)
    RUNNING = "running"
    PAUSED = "paused"  # checkpointed and stopped on request; resume queues it again
    # Its process was asked to stop (Ctrl-C or SIGTERM of the embedded studio): checkpointed at the last step it
    # finished, and claimed at once by the next worker or studio that looks for runs to train (no lease to expire).
    INTERRUPTED = "interrupted"
    COMPLETED = "completed"
    CANCELLED = "cancelled"
    FAILED = "failed"


ACTIVE_STATUSES = (RunStatus.QUEUED, RunStatus.RUNNING)
CLAIMABLE_STATUSES = (RunStatus.QUEUED, RunStatus.INTERRUPTED)  # what a worker may claim at once
FINISHED_STATUSES = (RunStatus.COMPLETED, RunStatus.CANCELLED, RunStatus.FAILED)


class RunKind(models.TextChoices):
    """What a run does, set when it is created: which attempt runs it (apps/runs/attempts/), which embedded lane
    picks it up, how its pages read it."""

    GRPO = "grpo", "GRPO training"
    SFT = "sft", "supervised fine-tuning"  # on a dataset's conversations (SFTConfig.dataset); nothing is sampled
    DPO = "dpo", "DPO preference training"  # on a dataset's preference pairs; nothing is sampled
    EVALUATION = "evaluation", "evaluation"  # an eval suite's tasks answered by a model; nothing is trained
    REFERENCE = "reference", "reference check"  # a bundle's own reference answers verified; nothing is trained
    # Trained elsewhere (TRL, verifiers, verl ... through `manage.py environments serve`): the studio records the
    # episodes its trainer plays in the bundle's environments (apps/runs/external.py) and runs nothing itself, so no
    # lane, worker or attempt ever takes one; its owner finishes it.
    EXTERNAL = "external", "trained elsewhere"


TRAINING_KINDS = (RunKind.GRPO, RunKind.SFT, RunKind.DPO)  # the kinds that train a model (and have checkpoints)
DATASET_KINDS = (RunKind.SFT, RunKind.DPO)  # the kinds that train on a dataset (SFTConfig.dataset)
# The kinds the studio runs itself: a worker or an embedded lane claims them (services.run_claim), the watchdog
# requeues them when their worker is lost.
STUDIO_RUN_KINDS = (RunKind.GRPO, RunKind.SFT, RunKind.DPO, RunKind.EVALUATION, RunKind.REFERENCE)


class RunRequest(models.TextChoices):
    """What the run's owner asked a running worker to do at its next step boundary."""

    NONE = ""
    PAUSE = "pause"
    CANCEL = "cancel"


class Run(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="runs")
    name = models.CharField(max_length=200)
    kind = models.CharField(max_length=16, choices=RunKind.choices, default=RunKind.GRPO)
    # None only for an SFT or DPO run on a dataset alone (train --kind sft --dataset ... without --bundle): the
    # dataset's pinned hash and the config then say everything it trained on.
    bundle = models.ForeignKey(Version, null=True, blank=True, on_delete=models.PROTECT, related_name="runs")
    config = models.JSONField()  # the resolved config of its kind (workers/rl/config.py), every field present
    config_hash = models.CharField(max_length=64)  # sha256 of the bundle's content hash (if any) and the config
    status = models.CharField(max_length=16, choices=RunStatus.choices, default=RunStatus.QUEUED)
    requested = models.CharField(max_length=16, choices=RunRequest.choices, default=RunRequest.NONE, blank=True)
    step = models.PositiveIntegerField(default=0)  # trainer steps completed
    steps_total = models.PositiveIntegerField()  # 0: not known (an external run: its trainer's plan is its own)
    attempt = models.PositiveIntegerField(default=0)  # bumped by every claim; the fencing token
    worker = models.CharField(max_length=200, blank=True, default="")  # host:pid of the current attempt
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    # The end-of-run summary (manage.py train --json); an external run's episode tally as it goes (external.py)
    summary = models.JSONField(default=dict, blank=True)
    error = models.TextField(blank=True, default="")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["project", "-created_at"]), models.Index(fields=["status"]),
                   models.Index(fields=["kind", "status"])]

    def __str__(self) -> str:
        return f"run {self.name} ({self.id})"

    @property
    def is_reference_check(self) -> bool:
        """Its answers are the tasks' own references, not a model's."""
        return self.kind == RunKind.REFERENCE

    @property
    def is_external(self) -> bool:
        """Trained elsewhere: the studio only records its episodes (apps/runs/external.py)."""
        return self.kind == RunKind.EXTERNAL

    @property
    def trained_on(self) -> str:
        """What the run is on, in a word for pages and events: its bundle version's ref, or its dataset's."""
        return self.bundle.ref if self.bundle is not None else self.config.get("dataset", "")

    @property
    def run_config(self) -> RunConfig:
        """The resolved config as the engine reads it, of its kind's class (`config` is its stored form)."""
        return config_class(self.kind).from_dict(self.config)


class Checkpoint(models.Model):
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="checkpoints")
    step = models.PositiveIntegerField()
    # Where its files are: a local directory, or its folder's URL in the object store (STUDIO_STORAGE_URL)
    path = models.CharField(max_length=500)
    bytes = models.BigIntegerField(default=0)
    # Copied out of the run's checkpoint directory (aliased, or queued for an evaluation): the run's retention
    # (keep_checkpoints) removes neither its files nor its row (apps/runs/checkpoints.py).
    kept = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["run", "-step"]
        constraints = [models.UniqueConstraint(fields=["run", "step"], name="checkpoint_step_unique")]


class CheckpointAlias(models.Model):
    """A name for a checkpoint of a project (`champion`, `challenger`, anything), moved by hand as MLflow's model
    aliases are; every move leaves an audit row (apps/runs/checkpoints.py)."""

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="checkpoint_aliases")
    name = models.SlugField(max_length=63)
    checkpoint = models.ForeignKey(Checkpoint, on_delete=models.PROTECT, related_name="aliases")
    moved_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    moved_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["project", "name"], name="checkpoint_alias_unique")]


class MetricPoint(models.Model):
    """One value of a namespaced series (`reward/mean`, `reward/arithmetic`, `idle/generation`, ...) at a
    trainer step. A resumed run that replays a step overwrites that step's points instead of adding more."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="metric_points")
    name = models.CharField(max_length=120)
    step = models.PositiveIntegerField()
    wall_time = models.FloatField()  # unix seconds when the step ended
    value = models.FloatField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["run", "name", "step"], name="metric_point_unique")]


class EventKind(models.TextChoices):
    CREATED = "created"
    STARTED = "started"  # a worker claimed the run
    RESUMED = "resumed"  # ... and restored it from a checkpoint
    CHECKPOINT_SAVED = "checkpoint_saved"
    WORKER_LOST = "worker_lost"  # the heartbeat went stale; the run was queued again
    RETRY = "retry"  # an infrastructure error retried (sandbox, verifier)
    PAUSED = "paused"
    INTERRUPTED = "interrupted"  # its process was asked to stop; the next start resumes it
    CANCELLED = "cancelled"
    COMPLETED = "completed"
    FAILED = "failed"
    REQUESTED = "requested"  # pause or cancel asked for; the worker acts on it at the next step
    REFERENCE_FAILED = "reference_failed"  # a reference check: a template's reference answers did not all pass


class RunEvent(models.Model):
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="events")
    kind = models.CharField(max_length=32, choices=EventKind.choices)
    message = models.TextField()
    step = models.PositiveIntegerField(null=True, blank=True)
    attempt = models.PositiveIntegerField(default=0)
    details = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["created_at", "id"]
        indexes = [models.Index(fields=["run", "created_at"])]

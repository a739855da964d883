"""Evaluations: a model's answers to an eval suite, and the endpoints that can be evaluated.

An eval suite is a bundle version marked for evaluation (its spec's `evaluation`: samples per task, temperature,
tasks per template, seed); everything it evaluates with — templates and their instances, sandbox images,
verifiers and the judge they name — is pinned by content hash in the bundle's closure. An evaluation is a run
(apps/runs/attempts/evaluation.py) whose trajectories are the answers; this row says which suite, which comparability
key, and what answered: a base model definition, a run's checkpoint, or an endpoint.
"""

from django.conf import settings
from django.db import models

from apps.accounts.models import Project
from apps.registry.models import Version
from apps.runs.models import Checkpoint, Run


class Endpoint(models.Model):
    """An OpenAI-compatible server to evaluate, at an address the egress policy allows (workers/egress.py). Its
    API key is a credential from the list apps/accounts/credentials.py keeps (`operator:NAME`, `project:NAME`),
    read only where the work runs.

    `api_key_env` is what endpoints named before that list (any environment variable, the studio's own secrets
    included): an endpoint that still has one is refused until an editor picks a credential
    (`endpoint_credential_set`); migration evals/0002 translated those that named STUDIO_ENDPOINT_KEY_<NAME>."""

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="endpoints")
    slug = models.SlugField(max_length=63)
    base_url = models.URLField(max_length=500)
    model = models.CharField(max_length=200)  # the model name the server knows
    credential = models.CharField(max_length=80, blank=True, default="")
    api_key_env = models.CharField(max_length=100, blank=True, default="")  # before credentials: refused
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["project", "slug"], name="endpoint_slug_unique")]

    def __str__(self) -> str:
        return f"endpoint/{self.slug}"


class TargetKind(models.TextChoices):
    BASE = "base", "base model"
    CHECKPOINT = "checkpoint", "checkpoint"
    ENDPOINT = "endpoint", "endpoint"


class Evaluation(models.Model):
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="evaluations")
    suite = models.ForeignKey(Version, on_delete=models.PROTECT, related_name="evaluations")  # a bundle version
    key = models.CharField(max_length=64, db_index=True)  # the comparability key (apps/evals/suites.py)
    key_parts = models.JSONField()  # what the key hashes, to say what differs between two keys
    run = models.OneToOneField(Run, on_delete=models.CASCADE, related_name="evaluation")
    kind = models.CharField(max_length=16, choices=TargetKind.choices)
    label = models.CharField(max_length=200)  # what answered, as the leaderboard names it
    model_version = models.ForeignKey(Version, null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    checkpoint = models.ForeignKey(Checkpoint, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    source_run = models.ForeignKey(Run, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    checkpoint_step = models.PositiveIntegerField(null=True, blank=True)
    endpoint = models.ForeignKey(Endpoint, null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    # The suite's tasks found in what the evaluated checkpoint trained on (workers/rl/tasks/overlap.py):
    # {"training": bundle ref, "exact": [task ids], "near": [task ids]}; empty when that is not known (a base
    # model's or an endpoint's training data is not the studio's).
    overlap = models.JSONField(default=dict, blank=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["project", "suite"])]

    def __str__(self) -> str:
        return f"evaluation of {self.label} on {self.suite.ref}"


class ExternalEvaluation(models.Model):
    """Scores a model got outside the studio, imported from another harness's results file (lm-evaluation-harness's
    results JSON). Shown beside the studio's evaluations, never ranked with them: its tasks, prompts and grading are
    the other harness's, so its comparability key (apps/evals/external.py) hashes what that file says it ran (the
    tasks with their versions, few-shot counts and configs), and only rows of one such key stand side by side."""

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="external_evaluations")
    label = models.CharField(max_length=200)  # the model, as the leaderboard names it
    harness = models.CharField(max_length=40, default="lm-evaluation-harness")
    harness_version = models.CharField(max_length=40, blank=True, default="")
    model_name = models.CharField(max_length=300, blank=True, default="")  # as the file names it
    key = models.CharField(max_length=64, db_index=True)
    key_parts = models.JSONField()  # per task: version, n-shot, config digest
    # task -> metric -> {"value", "stderr"} (lm-eval's "acc,none" read as metric "acc" under filter "none": the
    # metric's name here is "acc" for the filter none, "exact_match,strict-match" otherwise)
    scores = models.JSONField()
    results = models.JSONField()  # the file as imported, less its per-sample rows
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"external evaluation of {self.label} ({self.harness})"

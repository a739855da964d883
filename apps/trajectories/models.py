"""The trajectory archive: every attempt a run's policy made at a task, with its verdict.

A row is written once per trajectory id (a uuid derived from the run, the task draw and the sample index), so
a resumed run that replays a draw overwrites its row rather than adding one. Columns the browser filters and
sorts on are copied out of the JSON (domain, template, status, reward, deciding layer, policy version).
Artifacts (rendered screenshots, logs) live in the artifact store (artifacts.py); the row keeps their names.
"""

from django.db import models

from apps.accounts.models import Project


class Trajectory(models.Model):
    id = models.UUIDField(primary_key=True, editable=False)
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="trajectories")
    # By name: the archive lies below the runs app (runs archives trajectories; a row only points at its run).
    run = models.ForeignKey("runs.Run", on_delete=models.CASCADE, related_name="trajectories")
    seq = models.PositiveIntegerField()  # the run's task draw this trajectory answered
    sample = models.PositiveSmallIntegerField()  # its index in the GRPO group
    attempt = models.PositiveIntegerField()  # the run attempt that wrote it
    domain = models.CharField(max_length=63)
    template = models.CharField(max_length=140)  # task_template/slug@N
    task_key = models.CharField(max_length=200)
    task_hash = models.CharField(max_length=64)
    image = models.CharField(max_length=140)  # sandbox_image/slug@N
    verifier = models.CharField(max_length=140)  # verifier/slug@N
    policy_version = models.PositiveIntegerField()  # trainer steps completed by the weights that generated it
    # The trainer step that consumed it: trained on it when `effective`, or dropped it (its group had no reward
    # variance, it came too late for the staleness bound, or its infrastructure failed).
    step = models.PositiveIntegerField()
    effective = models.BooleanField(null=True)  # its group had reward variance and was trained on
    advantage = models.FloatField(null=True, blank=True)
    status = models.CharField(max_length=16)  # ok | policy_error | timeout | infra_error
    status_reason = models.TextField(blank=True, default="")
    reward = models.FloatField(null=True, blank=True)
    verdict_status = models.CharField(max_length=16, blank=True, default="")  # pass | fail | partial | infra_error
    deciding_layer = models.CharField(max_length=64, blank=True, default="")
    num_turns = models.PositiveSmallIntegerField(default=0)
    num_tool_calls = models.PositiveSmallIntegerField(default=0)
    completion_tokens = models.PositiveIntegerField(default=0)
    duration_s = models.FloatField(default=0)
    cost = models.FloatField(default=0)  # money: policy compute + sandbox CPU + judge
    prompt_ids = models.JSONField(default=list)
    turns = models.JSONField(default=list)  # workers.rl.types.Turn, as JSON
    verdict = models.JSONField(default=dict)  # workers.verifiers.Verdict, without artifacts
    timings = models.JSONField(default=dict)  # seconds per phase, queue and total
    costs = models.JSONField(default=dict)  # policy_seconds, sandbox_cpu_seconds, judge, and their money
    artifacts = models.JSONField(default=list)  # [{name, path, content_type, bytes}]
    started_at = models.DateTimeField()
    finished_at = models.DateTimeField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["run", "seq", "sample"], name="trajectory_draw_unique")]
        indexes = [
            models.Index(fields=["run", "seq", "sample"], name="trajectory_run_seq"),
            models.Index(fields=["project", "-finished_at", "id"], name="trajectory_project_recent"),
            models.Index(fields=["run", "domain"], name="trajectory_run_domain"),
            # A step's trajectories: an external run's points and groups, recomputed per episode (runs/external.py)
            models.Index(fields=["run", "step"], name="trajectory_run_step"),
        ]

    def __str__(self) -> str:
        return f"trajectory {self.id} ({self.template} {self.task_key})"

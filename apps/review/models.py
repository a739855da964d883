"""Review queues over archived trajectories: who reviews what, reservations, labels and adjudicated gold labels.

A queue is a list of trajectories (drawn from a trajectory filter and a sampling rule, once, and again from each
step runs archive when it follows them) and a rubric version (a registry `rubric`). Each item is labelled by up
to `overlap` reviewers; a reviewer holds a reservation on an item while labelling it, which expires, so an item
abandoned in a closed tab goes to someone else. A label records the rubric version it answered. A reviewer who
amends their label adds a revision (the earlier one is kept, no longer current); everything computed from labels
reads each reviewer's current revision. Where reviewers disagree, an adjudicator's decision is the gold answer
(Adjudication); the original labels stay as they were.
"""

from django.conf import settings
from django.db import models

from apps.accounts.models import Project
from apps.registry.models import Version
from apps.trajectories.models import Trajectory


class ReviewQueue(models.Model):
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="review_queues")
    slug = models.SlugField(max_length=63)
    description = models.TextField(blank=True, default="")
    rubric = models.ForeignKey(Version, on_delete=models.PROTECT, related_name="review_queues")
    filters = models.JSONField(default=dict)  # the trajectory browser's filters the items were drawn with
    sampling = models.JSONField(default=dict)  # the rule that drew them: {"rule": ..., "n": ..., "seed": ...}
    overlap = models.PositiveSmallIntegerField(default=1)  # reviewers per item
    blind = models.BooleanField(default=True)  # a reviewer never sees others' labels before submitting
    reservation_seconds = models.PositiveIntegerField(default=900)
    # A queue that follows runs: this share of what `filters` and `sampling` select among the trajectories runs
    # archive after it was drawn joins it (a judge's spot checks: verifier=verifier/SLUG, rule "judged").
    follow_share = models.FloatField(default=0.0)
    reviewers = models.ManyToManyField(settings.AUTH_USER_MODEL, related_name="review_queues")
    adjudicators = models.ManyToManyField(settings.AUTH_USER_MODEL, related_name="adjudicated_queues", blank=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["project", "slug"], name="review_queue_slug_unique")]
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"queue {self.project.slug}/{self.slug}"


class QueueItem(models.Model):
    queue = models.ForeignKey(ReviewQueue, on_delete=models.CASCADE, related_name="items")
    trajectory = models.ForeignKey(Trajectory, on_delete=models.CASCADE, related_name="queue_items")
    position = models.PositiveIntegerField()  # the order reviewers get items in
    why = models.CharField(max_length=200, blank=True, default="")  # what drew it: "stratum python-coding", ...
    removed = models.BooleanField(default=False)  # taken out of the queue: no more labels (kept ones stay)
    # Whole-trajectory labels so far, kept with each label's insert: finding the next open item reads this, not a
    # count of labels per item.
    labelled = models.PositiveSmallIntegerField(default=0)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["queue", "trajectory"], name="queue_item_unique"),
                       models.UniqueConstraint(fields=["queue", "position"], name="queue_item_position_unique")]
        indexes = [models.Index(fields=["queue", "labelled", "position"], name="queue_item_open")]
        ordering = ["queue", "position"]


class Reservation(models.Model):
    """A reviewer's hold on an item while labelling it. Counted against the overlap until it expires."""

    item = models.ForeignKey(QueueItem, on_delete=models.CASCADE, related_name="reservations")
    reviewer = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    expires_at = models.DateTimeField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["item", "reviewer"], name="one_reservation_per_reviewer")]
        indexes = [models.Index(fields=["reviewer", "expires_at"])]


class LabelQuerySet(models.QuerySet):
    def current(self):
        """Each label's latest revision: what agreement, calibration, canaries, datasets and progress read."""
        return self.filter(current=True)

    def whole(self):
        """Labels on the whole trajectory, not on one of its turns or verifier components."""
        return self.filter(step__isnull=True, component="")


class Label(models.Model):
    """A reviewer's answers on an item: on the whole trajectory (step None), or on one step of it.

    Never edited: amending adds a revision that `supersedes` this one, and this one stops being `current`."""

    item = models.ForeignKey(QueueItem, on_delete=models.CASCADE, related_name="labels")
    reviewer = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="review_labels")
    rubric = models.ForeignKey(Version, on_delete=models.PROTECT, related_name="+")  # the version it answered
    step = models.PositiveIntegerField(null=True, blank=True)  # the turn's index in the trajectory
    component = models.CharField(max_length=120, blank=True, default="")  # a verifier component, by name
    answers = models.JSONField(default=dict)  # question key -> answer
    comment = models.TextField(blank=True, default="")
    revision = models.PositiveIntegerField(default=1)  # 1 for the first answers, one more for each amendment
    # The revision this one amends; one-to-one, so two amendments of the same revision cannot both be written.
    supersedes = models.OneToOneField("self", null=True, blank=True, on_delete=models.SET_NULL,
                                      related_name="superseded_by")
    current = models.BooleanField(default=True)  # False once amended
    created_at = models.DateTimeField(auto_now_add=True)

    objects = LabelQuerySet.as_manager()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["item", "reviewer"], condition=models.Q(step__isnull=True,
                                                                                    component="", current=True),
                                    name="one_current_trajectory_label_per_reviewer"),
        ]
        indexes = [models.Index(fields=["item", "reviewer"])]


class Adjudication(models.Model):
    """The gold answer to one question on an item where reviewers disagreed."""

    item = models.ForeignKey(QueueItem, on_delete=models.CASCADE, related_name="adjudications")
    question = models.CharField(max_length=40)
    answer = models.JSONField()
    adjudicator = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    note = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["item", "question"], name="one_gold_answer_per_question")]


class Canary(models.Model):
    """A confirmed reward hack kept as a test: the (task, response) pair a verifier passed and a reviewer labelled
    `reward-hack`. Every later version of that verifier must score it 0 (`manage.py verify --canaries`). The task
    and the response are copied in, so the canary outlives the trajectory and the run."""

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="canaries")
    verifier = models.ForeignKey("registry.Definition", on_delete=models.CASCADE, related_name="canaries")
    passed_version = models.ForeignKey(Version, on_delete=models.PROTECT, related_name="+")  # the one it fooled
    trajectory_id = models.UUIDField()  # provenance; the archive row may be gone
    template = models.CharField(max_length=140)  # task_template/slug@N
    task_key = models.CharField(max_length=200)
    inputs = models.JSONField(default=dict)
    hidden = models.JSONField(default=dict)
    image = models.JSONField(default=dict)  # the sandbox image (SandboxImage.to_json) its checks ran in
    response = models.TextField()
    logs = models.TextField(blank=True, default="")
    label = models.ForeignKey(Label, null=True, on_delete=models.SET_NULL, related_name="+")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["verifier", "trajectory_id"], name="one_canary_per_hack")]


class CanaryResult(models.Model):
    """A verifier version's score on a canary: it holds when the score is 0."""

    canary = models.ForeignKey(Canary, on_delete=models.CASCADE, related_name="results")
    version = models.ForeignKey(Version, on_delete=models.CASCADE, related_name="canary_results")
    reward = models.FloatField(null=True)  # None: the check could not grade it (an infrastructure error)
    status = models.CharField(max_length=16)
    evidence = models.TextField(blank=True, default="")
    checked_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["canary", "version"], name="one_result_per_version")]

    @property
    def holds(self) -> bool:
        return self.reward == 0

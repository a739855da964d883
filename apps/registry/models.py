"""Definitions and their immutable versions, aliases, and task instances.

One Definition table for every kind (domain, task template, sandbox image, verifier, bundle, model, rubric,
dataset): versioning, aliases, diffs and import/export are one mechanism, and each kind differs only in its spec schema
(specs.py). Task instances live outside the spec, content-addressed and shared between versions through
instance sets, so tens of thousands of them cost one row each, once.
"""

from functools import cached_property

from django.conf import settings
from django.db import models

from apps.accounts.models import Project, slug_validator
from workers.definitions.specs import KINDS

from .lock import BundleLock


class Kind(models.TextChoices):
    DOMAIN = "domain"
    TASK_TEMPLATE = "task_template", "task template"
    SANDBOX_IMAGE = "sandbox_image", "sandbox image"
    VERIFIER = "verifier"
    BUNDLE = "bundle"
    MODEL = "model", "base model"
    RUBRIC = "rubric"
    DATASET = "dataset"


assert tuple(Kind.values) == KINDS


class ImmutableVersionError(Exception):
    pass


class Definition(models.Model):
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="definitions")
    kind = models.CharField(max_length=16, choices=Kind.choices)
    slug = models.CharField(max_length=63, validators=[slug_validator])
    description = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["project", "kind", "slug"], name="definition_slug_unique")]
        ordering = ["kind", "slug"]

    def __str__(self) -> str:
        return f"{self.kind}/{self.slug}"


class InstanceSet(models.Model):
    """The task instances of a task-template version. Versions that keep the same instances share the set."""

    definition = models.ForeignKey(Definition, on_delete=models.CASCADE, related_name="instance_sets")
    digest = models.CharField(max_length=64)
    count = models.PositiveIntegerField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["definition", "digest"], name="instance_set_digest_unique")]


class TaskInstance(models.Model):
    """One task: inputs the prompt sees, hidden references/tests the candidate never sees. Stored once per
    definition however many sets and versions include it."""

    definition = models.ForeignKey(Definition, on_delete=models.CASCADE, related_name="task_instances")
    key = models.CharField(max_length=200)
    content_hash = models.CharField(max_length=64)
    inputs = models.JSONField()
    hidden = models.JSONField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["definition", "content_hash"], name="instance_hash_unique")]


class InstanceSetMember(models.Model):
    instance_set = models.ForeignKey(InstanceSet, on_delete=models.CASCADE, related_name="members")
    key = models.CharField(max_length=200)  # copied from the instance so a set pages by key on one index
    instance = models.ForeignKey(TaskInstance, on_delete=models.PROTECT, related_name="+")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["instance_set", "key"], name="instance_key_unique_in_set")]


class VersionQuerySet(models.QuerySet):
    def update(self, **kwargs):
        raise ImmutableVersionError("Versions are immutable: publish a new version instead of updating one.")

    def delete(self):
        raise ImmutableVersionError("Versions are immutable and cannot be deleted.")


class Version(models.Model):
    """Never updated (refused here and by a database trigger, see migration 0002)."""

    definition = models.ForeignKey(Definition, on_delete=models.CASCADE, related_name="versions")
    number = models.PositiveIntegerField()
    spec = models.JSONField()
    schema_version = models.PositiveSmallIntegerField()
    content_hash = models.CharField(max_length=64, db_index=True)
    instance_set = models.ForeignKey(InstanceSet, null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    parent = models.ForeignKey("self", null=True, blank=True, on_delete=models.PROTECT, related_name="children")
    message = models.TextField(blank=True, default="")
    author = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                               related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    objects = VersionQuerySet.as_manager()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["definition", "number"], name="version_number_unique")]
        ordering = ["definition_id", "number"]

    def save(self, *args, **kwargs):
        if not self._state.adding:
            raise ImmutableVersionError(f"{self} is immutable: publish a new version instead.")
        super().save(*args, **kwargs)

    def delete(self, *args, **kwargs):
        raise ImmutableVersionError(f"{self} is immutable and cannot be deleted.")

    @property
    def ref(self) -> str:
        return f"{self.definition.kind}/{self.definition.slug}@{self.number}"

    @cached_property
    def lock(self) -> BundleLock:
        """What a bundle version pins (its `resolved` lock), parsed once: a version never changes. Empty for a
        version of any other kind."""
        return BundleLock.parse((self.spec or {}).get("resolved", []))

    def __str__(self) -> str:
        return self.ref


class Alias(models.Model):
    """A movable pointer such as `prod`. `latest` is not stored: it always means the newest version."""

    definition = models.ForeignKey(Definition, on_delete=models.CASCADE, related_name="aliases")
    name = models.CharField(max_length=63)
    version = models.ForeignKey(Version, on_delete=models.PROTECT, related_name="aliases")
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["definition", "name"], name="alias_name_unique")]
        ordering = ["name"]

"""The launch form: one suite, and one thing to evaluate on it."""

from django import forms

from apps.registry.models import Version
from apps.runs.models import Checkpoint

from .models import Endpoint


class EvaluationLaunchForm(forms.Form):
    """`what` is one choice among the project's base models (model:ID), checkpoints (checkpoint:ID) and
    endpoints (endpoint:ID)."""

    what = forms.ChoiceField(label="Evaluate")

    def __init__(self, *args, project, **kwargs):
        super().__init__(*args, **kwargs)
        models = Version.objects.filter(definition__project=project, definition__kind="model") \
            .select_related("definition").order_by("definition__slug", "-number")
        checkpoints = Checkpoint.objects.filter(run__project=project).select_related("run") \
            .order_by("-run__created_at", "-step")[:200]
        endpoints = Endpoint.objects.filter(project=project).order_by("slug")
        self.fields["what"].choices = [
            ("Base models", [(f"model:{v.pk}", v.ref) for v in models]),
            ("Checkpoints", [(f"checkpoint:{c.pk}", f"{c.run.name}@{c.step}") for c in checkpoints]),
            ("Endpoints", [(f"endpoint:{e.pk}", f"endpoint/{e.slug} ({e.model})") for e in endpoints])]

    def target(self, project) -> dict:
        kind, _, pk = self.cleaned_data["what"].partition(":")
        if kind == "model":
            return {"model": Version.objects.get(pk=pk, definition__project=project)}
        if kind == "checkpoint":
            return {"checkpoint": Checkpoint.objects.select_related("run").get(pk=pk, run__project=project)}
        return {"endpoint": Endpoint.objects.get(pk=pk, project=project)}

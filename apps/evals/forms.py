"""The launch form: one suite, and one thing to evaluate on it."""

import json

from django import forms

from apps.common import wiring
from apps.registry.models import Version
from apps.runs.models import Checkpoint, Run, RunKind

from .models import Endpoint


class EvaluationLaunchForm(forms.Form):
    """`what` is one choice among the project's base models (model:ID), checkpoints (checkpoint:ID) and
    endpoints (endpoint:ID); `trained_by`, for a model or an endpoint, the run trained elsewhere that trained it."""

    what = forms.ChoiceField(label="Evaluate")
    trained_by = forms.ChoiceField(label="trained by", required=False,
                                   help_text="for a model or an endpoint: the run trained elsewhere that trained it, "
                                             "so the scores on its bundle's tasks are shown apart")

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
        elsewhere = Run.objects.filter(project=project, kind=RunKind.EXTERNAL).order_by("-created_at")[:100]
        self.fields["trained_by"].choices = [("", "—"), *((str(r.pk), r.name) for r in elsewhere)]

    def target(self, project) -> dict:
        kind, _, pk = self.cleaned_data["what"].partition(":")
        trained_by = self.cleaned_data.get("trained_by")
        target = {"trained_by": Run.objects.get(pk=trained_by, project=project)} if trained_by else {}
        if kind == "model":
            return {**target, "model": Version.objects.get(pk=pk, definition__project=project)}
        if kind == "checkpoint":
            return {**target, "checkpoint": Checkpoint.objects.select_related("run").get(pk=pk, run__project=project)}
        return {**target, "endpoint": Endpoint.objects.get(pk=pk, project=project)}


class EndpointForm(forms.Form):
    """An endpoint to add (editors): its credential chosen from the studio's list, its address checked against the
    egress policy by endpoint_create before anything is saved."""

    slug = forms.SlugField(max_length=63, help_text="it is named endpoint/SLUG")
    base_url = forms.CharField(max_length=500, label="Base URL", help_text="e.g. https://api.example.com/v1")
    model = forms.CharField(max_length=200, help_text="the model name the server knows")
    credential = forms.ChoiceField(required=False, label="API key")

    def __init__(self, *args, credentials: list[str], **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["credential"].choices = [("", "none")] + [(name, name) for name in credentials]
        if not credentials:
            self.fields["credential"].help_text = (
                "no credential yet: an owner stores one for the project (project:NAME), or the operator declares "
                "STUDIO_ENDPOINT_KEY_NAME (operator:NAME)")
        policy = wiring.egress_policy()
        allowed = [*sorted(policy.hosts), *(str(network) for network in policy.networks)]
        self.fields["base_url"].help_text = (
            "e.g. https://api.example.com/v1; the workers reach public addresses"
            + (f", and what the operator allows in STUDIO_EGRESS_ALLOW here: {', '.join(allowed)}" if allowed
               else " only (the operator allows others in STUDIO_EGRESS_ALLOW)"))


class EndpointCredentialForm(forms.Form):
    """An endpoint's credential, picked again (an endpoint that named an environment variable)."""

    slug = forms.SlugField(max_length=63, widget=forms.HiddenInput)
    credential = forms.ChoiceField(required=False, label="API key")

    def __init__(self, *args, credentials: list[str], **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["credential"].choices = [("", "none")] + [(name, name) for name in credentials]


class SecretForm(forms.Form):
    """An API key an owner stores for the project's endpoints: write-only."""

    name = forms.RegexField(regex=r"^[A-Za-z0-9][A-Za-z0-9_-]{0,62}$", max_length=63,
                            help_text="endpoints name it project:NAME")
    value = forms.CharField(max_length=10_000, label="Key", widget=forms.PasswordInput(render_value=False),
                            strip=False, help_text="stored encrypted, never shown again")


class ExternalResultsForm(forms.Form):
    """An lm-evaluation-harness results file (results_<date>.json) to show as an external evaluation."""

    MAX_BYTES = 20 * 1024 * 1024

    file = forms.FileField(label="Results file", help_text="lm-evaluation-harness's results_<date>.json")
    label = forms.CharField(max_length=200, required=False, label="Model",
                            help_text="how the leaderboard names it (default: the file's model_name)")

    def clean_file(self):
        upload = self.cleaned_data["file"]
        if upload.size > self.MAX_BYTES:
            raise forms.ValidationError(f"the file is over {self.MAX_BYTES // (1024 * 1024)} MB")
        try:
            return json.loads(upload.read().decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError) as exc:
            raise forms.ValidationError(f"not a JSON file: {exc}")

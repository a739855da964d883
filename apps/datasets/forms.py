"""The build form: a dataset's slug and format, and one of each kind of source, each used when its box is ticked.
It checks each field's shape; `dataset_build` checks the rest (the spec's schema, the queue, the run, the rows)
and its errors are shown at the field they name."""

from __future__ import annotations

import re

from django import forms

from apps.common.forms import MultilineField
from apps.registry.models import Definition
from apps.review.models import ReviewQueue
from apps.runs.models import Run, RunKind
from workers.definitions.specs import DATASET_FORMATS

from .rows import MAX_UPLOAD_BYTES

FORMAT_HELP = {"sft": "sft: conversations (trajectories, a reference check, an upload)",
               "preference": "preference: chosen over rejected (review labels' pairs, an upload)"}
# A source's form fields, by source type, under the form's names (prefix + the spec's field name).
SOURCE_FIELDS = {
    "trajectories": ("run", "domain", "reward_min", "verdict_status", "deciding_layer", "accepted_in", "limit"),
    "review_pairs": ("queue",),
    "reference_check": ("bundle", "passed_only", "tool_calls_only", "template"),
}
PREFIX = {"trajectories": "traj_", "review_pairs": "pairs_", "reference_check": "ref_"}


class DatasetBuildForm(forms.Form):
    slug = forms.SlugField(max_length=63, help_text="Lowercase letters, digits and hyphens, e.g. smol-tools-sft.")
    description = MultilineField(required=False, widget=forms.Textarea(attrs={"rows": 2}))
    format = forms.ChoiceField(choices=[(f, FORMAT_HELP[f]) for f in DATASET_FORMATS])
    exclude_eval_tasks = forms.BooleanField(required=False, initial=True,
                                            help_text="Leave out every task an eval suite of the project asks.")
    message = forms.CharField(required=False, max_length=500, help_text="Says why this version was built.")

    use_trajectories = forms.BooleanField(required=False, label="archived trajectories")
    traj_run = forms.ChoiceField(required=False, label="run")
    traj_domain = forms.CharField(required=False, max_length=63, label="domain")
    traj_reward_min = forms.FloatField(required=False, label="reward at least")
    traj_verdict_status = forms.ChoiceField(required=False, label="verdict",
                                            choices=[("", "any"), ("pass", "pass"), ("partial", "partial"),
                                                     ("fail", "fail")])
    traj_deciding_layer = forms.CharField(required=False, max_length=64, label="deciding layer")
    traj_accepted_in = forms.ChoiceField(required=False, label="accepted in review queue")
    traj_limit = forms.IntegerField(required=False, min_value=1, max_value=1_000_000, initial=10_000,
                                    label="at most", help_text="The newest first.")

    use_review_pairs = forms.BooleanField(required=False, label="review labels' preference pairs")
    pairs_queue = forms.ChoiceField(required=False, label="review queue")

    use_reference_check = forms.BooleanField(required=False, label="a reference check's trajectories")
    ref_bundle = forms.ChoiceField(required=False, label="bundle")
    ref_passed_only = forms.BooleanField(required=False, initial=True, label="passed only")
    ref_tool_calls_only = forms.BooleanField(required=False, label="tool calls only")
    ref_template = forms.CharField(required=False, max_length=63, label="task template",
                                   help_text="A template's slug; empty: every template.")

    upload = forms.FileField(required=False, label="JSONL file",
                             help_text='One row a line: {"messages": [...]} (sft) or {"prompt", "chosen", '
                                       '"rejected"} (preference), as TRL and OpenAI fine-tuning read them.')

    GROUPS = (("Dataset", ("slug", "description", "format", "exclude_eval_tasks", "message")),
              ("Archived trajectories", ("use_trajectories", "traj_run", "traj_domain", "traj_reward_min",
                                         "traj_verdict_status", "traj_deciding_layer", "traj_accepted_in",
                                         "traj_limit")),
              ("Review labels' preference pairs", ("use_review_pairs", "pairs_queue")),
              ("A reference check", ("use_reference_check", "ref_bundle", "ref_passed_only", "ref_tool_calls_only",
                                     "ref_template")),
              ("An uploaded file", ("upload",)))

    def __init__(self, *args, project, **kwargs):
        super().__init__(*args, **kwargs)
        runs = Run.objects.filter(project=project).exclude(kind=RunKind.EVALUATION).only("id", "name")[:100]
        queues = list(ReviewQueue.objects.filter(project=project).order_by("slug").values_list("slug", flat=True))
        checked = (Run.objects.filter(project=project, kind=RunKind.REFERENCE)
                   .values_list("bundle__definition__slug", flat=True).distinct())
        bundles = sorted(set(checked) | set(Definition.objects.filter(project=project, kind="bundle")
                                            .values_list("slug", flat=True)))
        self.fields["traj_run"].choices = [("", "any run"), *[(run.name, run.name) for run in runs]]
        self.fields["traj_accepted_in"].choices = [("", "reviewed or not"), *[(q, q) for q in queues]]
        self.fields["pairs_queue"].choices = [("", "—"), *[(q, q) for q in queues]]
        self.fields["ref_bundle"].choices = [("", "—"), *[(b, b) for b in bundles]]

    def clean_upload(self):
        upload = self.cleaned_data["upload"]
        if upload is not None and upload.size > MAX_UPLOAD_BYTES:  # refused before it is read into memory
            raise forms.ValidationError(f"the file is {upload.size / 1e6:.0f} MB; the limit is "
                                        f"{MAX_UPLOAD_BYTES / 1e6:.0f} MB")
        return upload

    def groups(self):
        return [(legend, [self[name] for name in names]) for legend, names in self.GROUPS]

    def sources(self) -> list[dict]:
        """The ticked sources as the spec's (call after is_valid); the upload's is added by the view once the
        file is stored."""
        found = []
        for kind, names in SOURCE_FIELDS.items():
            if not self.cleaned_data[f"use_{kind}"]:
                continue
            source = {"type": kind}
            for name in names:
                value = self.cleaned_data[PREFIX[kind] + name]
                if value not in (None, ""):
                    source[name] = value
            found.append(source)
        return found

    def place(self, error_field: str, sources: list[dict]) -> str | None:
        """The form field an error about the spec's `sources[i].name` (or `file`, `format`) belongs at; None: the
        form's top."""
        if error_field in self.fields:
            return error_field
        if error_field == "file":
            return "upload"
        match = re.fullmatch(r"sources\[(\d+)\](?:\.(\w+))?.*", error_field)
        if match is None or int(match[1]) >= len(sources):
            return None
        kind = sources[int(match[1])]["type"]
        if kind == "upload":
            return "upload"
        name = PREFIX[kind] + (match[2] or "")
        return name if name in self.fields else f"use_{kind}"

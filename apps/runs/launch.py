"""The run form (/p/<project>/runs/new/): the settings of the kind of run chosen as form fields — grouped, each
with its default, its bounds and its help — and what the review step shows before anything is queued: the
resolved config, its hash (both from services.run_config_resolve, the code run_create stores them with) and an
upper bound of the first step's cost.

Every form field comes from the kinds' config classes (workers/rl/config.py): its type picks the widget, BOUNDS
the min and max, field_help() the help text, SET_BY_THE_STUDIO the fields shown but never editable. The form holds
the fields of every kind it starts (TRAINING_KINDS) and shows those of the kind chosen (static/js/run_form.js
shows the others' when the kind changes); a setting of another kind that is posted changed is refused at its field
by the kind's config. A new config field appears here without an edit; only its group has to be named below.
"""

from __future__ import annotations

import dataclasses
import json
import typing
from dataclasses import dataclass

from django import forms

from apps.common.errors import StudioError
from apps.common.forms import MultilineField
from apps.registry.models import Version
from apps.runs.models import DATASET_KINDS, TRAINING_KINDS, RunKind
from workers.definitions.specs import Limits
from workers.rl.config import BOUNDS, SET_BY_THE_STUDIO, config_class, field_help
from workers.rl.models.packaged import DEMO_MODEL

# The dataclasses list their fields in the order they were added, and workers/ knows nothing of pages; a person
# starting a run decides them in these groups: which model, how tasks are drawn and sampled, how GRPO updates, how
# the optimizer steps, what SFT and DPO train on, how the pipeline overlaps its stages, what bounds a rollout, how
# the run is evaluated. The grouping is a page's concern, so it lives here, once, for the form and the review alike.
# A field named in no group is shown under "Other" (never hidden), and tests/apps/runs/test_run_form.py fails until
# it is given a group.
GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("Model", ("model", "model_version", "model_sha256", "start_from", "chat_template", "engine", "device",
               "precision", "data_parallel", "lora_rank", "lora_alpha")),
    ("Sampling", ("temperature", "curriculum", "dynamic_sampling", "oversampling", "domain_weights",
                  "domain_quotas", "category_weights", "category_quotas")),
    ("GRPO", ("groups_per_step", "group_size", "clip_low", "clip_high", "normalize_std", "kl_coef")),
    ("SFT and DPO", ("dataset", "dataset_file", "dataset_sha256", "batch_size", "dpo_beta")),
    ("Training", ("seed", "learning_rate", "lr_schedule", "warmup_steps", "weight_decay", "max_grad_norm",
                  "micro_batch_size", "micro_batch_tokens")),
    ("Pipeline", ("mode", "max_staleness", "partial_rollouts", "speculative_tokens", "rollout_concurrency",
                  "verify_concurrency", "inference_servers", "checkpoint_every", "keep_checkpoints")),
    ("Limits", ("context_length", "max_tool_output_chars")),
    ("Evaluation", ("eval_tasks_per_domain", "eval_suite", "eval_suite_every", "reference_per_template",
                    "evaluation")),
)
OTHER = "Other"
FORM_CONFIGS = [config_class(kind) for kind in TRAINING_KINDS]  # the kinds the form starts, GRPO first
# Every field of those kinds, in their classes' order, with its default and the kinds that have it (a field is
# declared in one class, so its default is the same in every kind that has it).
DEFAULTS = {name: value for cls in FORM_CONFIGS for name, value in dataclasses.asdict(cls()).items()}
CONFIG_FIELDS = tuple(DEFAULTS)
KINDS_OF = {name: tuple(cls.kind for cls in FORM_CONFIGS if name in cls.names()) for name in CONFIG_FIELDS}
HINTS = {name: hint for cls in FORM_CONFIGS for name, hint in typing.get_type_hints(cls).items() if name in DEFAULTS}
RUN_FIELDS = ("bundle", "kind", "steps", "name", "from_run", "reviewed")  # the form's own fields, beside the config's
MULTILINE = ("chat_template",)


def grouped(names) -> list[tuple[str, list[str]]]:
    """`names` (config fields) in GROUPS' groups and order; the ones no group names under OTHER, at the end."""
    names = list(names)
    groups = [(title, [n for n in members if n in names]) for title, members in GROUPS]
    named = {n for _, members in GROUPS for n in members}
    groups.append((OTHER, [n for n in names if n not in named]))
    return [(title, members) for title, members in groups if members]


def show(value) -> str:
    """A config value as the form and the review write it."""
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, dict):
        return json.dumps(value, sort_keys=True)
    if value == "":
        return "(empty)"
    return str(value)


def _number(value) -> str:
    return f"{value:,}" if isinstance(value, int) else f"{value:g}"


class ObjectField(forms.JSONField):
    """A JSON object (domain slug -> number); empty is {}."""

    def to_python(self, value):
        value = super().to_python(value)
        if value in (None, ""):
            return {}
        if not isinstance(value, dict):
            raise forms.ValidationError('write a JSON object, e.g. {"arithmetic": 2}')
        return value


def config_field(name: str, hint) -> forms.Field:
    """The form field for config field `name` of type `hint`."""
    if name in SET_BY_THE_STUDIO:
        return forms.CharField(required=False, disabled=True)
    default = DEFAULTS[name]
    low, high = BOUNDS.get(name, (None, None))
    if typing.get_origin(hint) is typing.Literal:
        return forms.ChoiceField(choices=[(v, v) for v in typing.get_args(hint)])
    if isinstance(default, bool):
        return forms.BooleanField(required=False)
    if isinstance(default, int):
        return forms.IntegerField(min_value=low, max_value=high)
    if isinstance(default, float):
        return forms.FloatField(min_value=low, max_value=high)
    if isinstance(default, dict):
        return ObjectField(required=False, widget=forms.TextInput(attrs={"class": "code"}))
    if name in MULTILINE:
        return MultilineField(required=False, strip=False, widget=forms.Textarea(attrs={"rows": 3, "class": "code"}))
    return forms.CharField(required=False, max_length=1000)


@dataclass(frozen=True)
class ConfigInput:
    """One config field on the page: the bound field, what the page says about it, the kinds that have it, and
    whether it shows (a field of the chosen kind, or one with an error to read); a hidden one is disabled too, so
    the browser does not post it."""

    field: forms.BoundField
    name: str
    help: str
    default: str
    bounds: str
    studio: bool
    kinds: str  # space-separated, for run_form.js
    shown: bool

    def widget(self) -> str:
        return self.field.as_widget(attrs=None if self.shown else {"disabled": True})


class RunForm(forms.Form):
    """A bundle, a kind, steps, a name and the config fields of every kind the form starts, those of the chosen kind
    shown. Started fresh, each config field starts at its default; started from an earlier run (`earlier`), at that
    run's value. The overrides are the chosen kind's fields whose value is not the default — on a fresh form exactly
    the ones the user changed, from an earlier run its settings and the user's changes — and any other kind's field
    that was posted changed, which the kind's config then refuses at its field."""

    bundle = forms.ModelChoiceField(queryset=Version.objects.none(), required=False,
                                    empty_label="none: SFT or DPO on the dataset alone")
    kind = forms.ChoiceField(choices=[(kind, RunKind(kind).label) for kind in TRAINING_KINDS], initial=RunKind.GRPO,
                             help_text="GRPO samples and verifies its own data; SFT and DPO train on the dataset "
                                       "named under SFT and DPO (dataset/SLUG@N). Each shows its own settings.")
    steps = forms.IntegerField(min_value=1, max_value=1_000_000, initial=100)
    name = forms.CharField(max_length=200, required=False, help_text="Empty: the bundle's slug and the time.")
    from_run = forms.UUIDField(required=False, widget=forms.HiddenInput)
    reviewed = forms.CharField(required=False, max_length=64, widget=forms.HiddenInput)

    def __init__(self, *args, project, earlier=None, **kwargs):
        super().__init__(*args, **kwargs)
        bundles = self.fields["bundle"]
        bundles.queryset = (Version.objects.filter(definition__project=project, definition__kind="bundle")
                            .select_related("definition").order_by("definition__slug", "-number"))
        bundles.label_from_instance = _bundle_label
        if earlier is not None and earlier.kind in TRAINING_KINDS:  # from a run trained elsewhere: its bundle only
            self.initial.setdefault("kind", earlier.kind)
        start = _start_values(earlier)
        self.chosen_kind = self._chosen_kind()
        for name in CONFIG_FIELDS:
            self.fields[name] = config_field(name, HINTS[name])
            self.fields[name].label = name
            if self.chosen_kind not in KINDS_OF[name]:
                self.fields[name].required = False  # hidden and disabled: the browser does not post it
            self.initial.setdefault(name, start[name])
        if earlier is None:
            first = bundles.queryset.first()  # a GRPO run, the form's default kind, needs one
            self.initial.setdefault("bundle", first.pk if first else None)
        else:
            self.initial.setdefault("bundle", earlier.bundle_id)
            self.initial.setdefault("steps", earlier.steps_total or self.fields["steps"].initial)
            self.initial.setdefault("from_run", earlier.pk)
        self.posted = frozenset(self.data)  # what the browser sent: another kind's settings only where changed
        if self.is_bound:
            self._start_unposted()

    def _start_unposted(self) -> None:
        """Another kind's settings the browser did not post (hidden and disabled) take their starting values, where
        the form shows them should that kind be chosen again; only what was posted can override (`overrides`)."""
        data = self.data.copy()
        for name in CONFIG_FIELDS:
            if name in self.posted or name in SET_BY_THE_STUDIO or self.chosen_kind in KINDS_OF[name]:
                continue
            value = self.initial[name]
            if not isinstance(value, bool):
                data[name] = self.fields[name].prepare_value(value)
            elif value:  # a ticked checkbox posts "on"; an unticked one nothing
                data[name] = "on"
        self.data = data

    def _chosen_kind(self) -> str:
        """The kind whose settings the form shows and takes: the one posted, else the one it starts with."""
        posted = self.data.get("kind") if self.is_bound else None
        return posted if posted in TRAINING_KINDS else self.initial.get("kind", RunKind.GRPO)

    def clean(self):
        cleaned = super().clean()
        if not cleaned.get("bundle") and cleaned.get("kind") not in DATASET_KINDS:
            self.add_error("bundle", "a GRPO run samples its bundle's tasks: pick one (only SFT and DPO runs may "
                                     "train on their dataset alone)")
        return cleaned

    def run_fields(self) -> list[forms.BoundField]:
        return [self["bundle"], self["kind"], self["steps"], self["name"]]

    def reviewed_fields(self) -> list[forms.BoundField]:
        """What the review's "Queue run" posts again: the run's fields and the chosen kind's settings."""
        return [*self.run_fields(), self["from_run"],
                *(self[name] for name in CONFIG_FIELDS if self.chosen_kind in KINDS_OF[name])]

    def groups(self) -> list[tuple[str, bool, list[ConfigInput]]]:
        """(title, whether it shows, its inputs) for every group of config fields."""
        docs = field_help()
        groups = []
        for title, names in grouped(CONFIG_FIELDS):
            inputs = [ConfigInput(
                field=self[name], name=name, help=docs.get(name, ""), default=show(DEFAULTS[name]),
                bounds=" to ".join(_number(x) for x in BOUNDS[name]) if name in BOUNDS else "",
                studio=name in SET_BY_THE_STUDIO, kinds=" ".join(KINDS_OF[name]),
                shown=self.chosen_kind in KINDS_OF[name] or bool(self[name].errors)) for name in names]
            groups.append((title, any(i.shown for i in inputs), inputs))
        return groups

    def overrides(self) -> dict:
        """The editable config fields whose value is not the default (call after is_valid): the chosen kind's, and
        another kind's only where the browser posted it (a checkbox left unticked is not posted)."""
        kind = self.cleaned_data["kind"]
        return {name: self.cleaned_data[name] for name in CONFIG_FIELDS
                if name not in SET_BY_THE_STUDIO and (kind in KINDS_OF[name] or name in self.posted)
                and self.cleaned_data[name] not in (None, DEFAULTS[name])}

    def add_config_error(self, error: StudioError) -> None:
        """A refusal from run_config_resolve or run_create: each problem at the config field it names; one about
        a field the form does not edit (set by the studio, or only in the bundle's run_config) at the top, as
        `config: field: problem`; a refusal naming no field at the top, in its own words."""
        if not error.errors:
            self.add_error(None, str(error))
        for problem in error.errors:
            if problem.field in CONFIG_FIELDS and problem.field not in SET_BY_THE_STUDIO:
                self.add_error(problem.field, problem.problem)
            else:
                self.add_error(None, f"config: {problem}")


assert not set(RUN_FIELDS) & set(CONFIG_FIELDS), "a config field shares its name with the run form's own"


BUNDLE_LABEL_CHARS = 90  # a long run_config must not widen the page: the review shows all of it


def _bundle_label(version: Version) -> str:
    settings = (version.spec or {}).get("run_config") or {}
    if not settings:
        return version.ref
    label = f"{version.ref} (sets {', '.join(f'{k}={show(v)}' for k, v in sorted(settings.items()))})"
    return label if len(label) <= BUNDLE_LABEL_CHARS else label[:BUNDLE_LABEL_CHARS - 2] + "…)"


def _start_values(earlier) -> dict:
    """Each config field's starting value: the default, or the earlier run's (its model as the exact model
    definition version or the checkpoint it pinned, so the new run pins the same one again)."""
    values = dict(DEFAULTS)
    if earlier is None:
        return values
    config = earlier.config or {}
    values.update({k: v for k, v in config.items() if k in values})
    if config.get("model_version"):
        values["model"] = config["model_version"]
    if config.get("start_from"):  # the same checkpoint again, by its run's id (names repeat)
        values["model"] = f"checkpoint {config['start_from']['run']}@{config['start_from']['step']}"
    return values


# --- the review: what the first step may cost ---------------------------------------------------------------

@dataclass(frozen=True)
class StepEstimate:
    """An upper bound of the first trainer step's sampling, from the resolved config and the pinned task
    templates' limits. Each rollout stops at its template's max_tokens sampled tokens (over all its turns) and
    max_turns model turns; most stop far sooner. Prompt tokens are not counted."""

    groups: int  # the most task groups the step consumes (oversampling × groups_per_step with dynamic sampling)
    dynamic_sampling: bool
    group_size: int
    rollouts: int
    max_tokens: int  # the largest max_tokens among the bundle's templates
    max_turns: int
    tokens: int  # rollouts × max_tokens
    model_turns: int  # rollouts × max_turns
    templates: list[tuple[str, int, int]]  # (template version, max_tokens, max_turns)
    domains: int
    eval_samples: int  # the evaluation before the first step: eval_tasks_per_domain per domain, one sample each
    eval_tokens: int


def first_step_estimate(*, bundle: Version, config: dict) -> StepEstimate:
    lock = bundle.lock
    versions = [v for v in Version.objects.filter(
        definition__project_id=bundle.definition.project_id, definition__kind="task_template",
        definition__slug__in=[p.ref.slug for p in lock.of_kind("task_template")]).select_related("definition")
        if lock.number("task_template", v.definition.slug) == v.number]
    limits = Limits()
    templates = sorted((v.ref, int(v.spec.get("limits", {}).get("max_tokens", limits.max_tokens)),
                        int(v.spec.get("limits", {}).get("max_turns", limits.max_turns))) for v in versions)
    max_tokens = max((t[1] for t in templates), default=0)
    max_turns = max((t[2] for t in templates), default=0)
    groups = config["groups_per_step"] * (config["oversampling"] if config["dynamic_sampling"] else 1)
    rollouts = groups * config["group_size"]
    domains = len(lock.of_kind("domain"))
    eval_samples = config["eval_tasks_per_domain"] * domains
    return StepEstimate(groups=groups, dynamic_sampling=config["dynamic_sampling"], group_size=config["group_size"],
                        rollouts=rollouts, max_tokens=max_tokens, max_turns=max_turns, tokens=rollouts * max_tokens,
                        model_turns=rollouts * max_turns, templates=templates, domains=domains,
                        eval_samples=eval_samples, eval_tokens=eval_samples * max_tokens)


def origin(name: str, value, *, overrides: dict, bundle: Version | None) -> str:
    """Where a resolved value came from, for the review: the form, the bundle's run_config, the studio (a model
    definition's pins) or the default."""
    if name in overrides:
        return "changed"
    if bundle is not None and name in ((bundle.spec or {}).get("run_config") or {}):
        return "bundle"
    return "default" if value == DEFAULTS.get(name) else "studio"


def default_model_note(*, config: dict, overrides: dict, bundle: Version | None) -> str:
    """The review's warning when neither the bundle's run_config nor the form names a model: the run then trains
    the config's default, which is easy to miss among fifty settings marked "default"."""
    if origin("model", config["model"], overrides=overrides, bundle=bundle) != "default":
        return ""
    described = " (the studio's tiny demo model)" if config["model"] == DEMO_MODEL else ""
    return (f"No model in the bundle or the form: this run trains {config['model']}{described}. Name one under "
            "Model in the form, or as run_config.model in the bundle.")

"""Typed schemas for definition specs, one per kind. Pure pydantic, no Django: the workers read them too.

`validate_spec(kind, data)` returns the normalised spec (defaults filled in, so the content hash does not
depend on whether an author omitted a default) or raises SpecError listing every problem with its field.
"""

import string
import types
import typing
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_serializer, model_validator

from .canonical import data_problem

SPEC_SCHEMA_VERSION = 1
MAX_SPEC_BYTES = 1_000_000  # task data belongs in task instances, not in a spec

KINDS = ("domain", "task_template", "sandbox_image", "verifier", "bundle", "model", "rubric", "dataset")
# The order to publish kinds in: a spec names only definitions of kinds before its own (bundles also name
# bundles, published in the order they include each other, so they come last; a dataset names none).
PUBLISH_ORDER = ("model", "rubric", "dataset", "sandbox_image", "verifier", "task_template", "domain", "bundle")
SLUG_RE = r"[a-z0-9][a-z0-9-]{0,62}"
ALIAS_RE = r"[a-z][a-z0-9-]{0,62}"
# slug, slug@3, slug@prod: a reference to a definition of a known kind, floating or pinned.
REF_RE = rf"^{SLUG_RE}(@([1-9][0-9]*|[a-z][a-z0-9-]{{0,62}}))?$"
# kind/slug@N: an exact version (what bundles pin once published; aliases are resolved on publish).
VERSION_REF_RE = rf"^({'|'.join(KINDS)})/{SLUG_RE}@([1-9][0-9]*|[a-z][a-z0-9-]{{0,62}})$"

Ref = Annotated[str, Field(pattern=REF_RE, description="slug, slug@N or slug@alias")]
VersionRef = Annotated[str, Field(pattern=VERSION_REF_RE, description="kind/slug@N or kind/slug@alias")]
Weight = Annotated[float, Field(ge=0, le=1000)]
Fraction = Annotated[float, Field(ge=0, le=1)]


@dataclass(frozen=True)
class FieldError:
    field: str
    problem: str

    def __str__(self) -> str:
        return f"{self.field}: {self.problem}" if self.field else self.problem


class SpecError(ValueError):
    """Every problem found in one spec, each naming its field."""

    def __init__(self, errors: list[FieldError]):
        self.errors = errors
        super().__init__("; ".join(str(e) for e in errors))


class Spec(BaseModel):
    # Unknown fields are errors: a typo in a spec must not silently fall back to a default. Frozen: a parsed spec is
    # shared (a task template's, by every rollout thread) and, like the version it came from, never changes.
    model_config = ConfigDict(extra="forbid", str_strip_whitespace=False, frozen=True)


class GrownSpec(Spec):
    """A spec that gained optional fields after versions of its kind were published: those fields are left out
    of the normalised spec while empty, so the versions published before them keep their content hash."""

    ADDED_LATER: ClassVar[tuple[str, ...]] = ()

    @model_serializer(mode="wrap")
    def _without_empty_later_fields(self, handler):
        data = handler(self)
        for name in self.ADDED_LATER:
            if not data.get(name):
                data.pop(name, None)
        return data


# --- domain -----------------------------------------------------------------------------------------------


class TemplateDraw(Spec):
    template: Ref
    weight: Weight = 1.0


class DomainSpec(GrownSpec):
    ADDED_LATER = ("category",)

    sampling_weight: Weight = 1.0
    # Domains come by the hundred (a generator library's datasets): the pages group and filter them by category,
    # and a run's weights and quotas can be set per category as well as per domain.
    category: str = Field(default="", pattern=rf"^({SLUG_RE})?$",
                          description="the group this domain belongs to, e.g. algebra (empty: none)")
    templates: list[TemplateDraw] = Field(min_length=1)

    @field_validator("templates")
    @classmethod
    def templates_distinct(cls, draws: list[TemplateDraw]) -> list[TemplateDraw]:
        seen = [d.template.split("@")[0] for d in draws]
        duplicates = sorted({s for s in seen if seen.count(s) > 1})
        if duplicates:
            raise ValueError(f"template listed twice: {', '.join(duplicates)}")
        return draws


# --- task template ----------------------------------------------------------------------------------------


class ToolSpec(Spec):
    name: str = Field(pattern=r"^[a-zA-Z_][a-zA-Z0-9_]{0,63}$")
    description: str = ""
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})

    def function(self) -> dict[str, Any]:
        """The tool as the function schema a chat template's `tools` and an OpenAI endpoint's `function` take."""
        return {"name": self.name, "description": self.description, "parameters": self.parameters}


class Limits(GrownSpec):
    """Per trajectory (max_turns, max_tokens, max_seconds, max_tool_calls) and per turn (max_turn_*), kept apart:
    a trajectory's budget spent ends it; a turn's budget spent cuts that turn short and the trajectory goes on.
    0 for a later field: no limit of that kind."""

    ADDED_LATER = ("max_tool_calls", "max_turn_tokens", "max_turn_seconds", "max_turn_calls", "max_tool_errors")

    max_turns: int = Field(default=1, ge=1, le=1000, description="model turns before the episode ends (1: one "
                                                                  "answer, no tool results seen)")
    max_tokens: int = Field(default=1024, ge=1, le=10_000_000, description="tokens the model may sample over the whole "
                                                                          "rollout, all turns together")
    max_seconds: float = Field(default=60, gt=0, le=86_400, description="wall-clock budget of one rollout, tool "
                                                                         "calls included")
    max_tool_calls: int = Field(default=0, ge=0, le=100_000, description="tool calls over the whole rollout; then "
                                                                         "it ends (0: no limit but the turns)")
    max_turn_tokens: int = Field(default=0, ge=0, le=10_000_000, description="tokens the model may sample in one "
                                                                            "turn (0: only the rollout's budget)")
    max_turn_seconds: float = Field(default=0, ge=0, le=86_400, description="wall-clock budget of one turn's tool "
                                                                            "calls together (0: no limit)")
    max_turn_calls: int = Field(default=0, ge=0, le=1000, description="tool calls run from one turn; the rest are "
                                                                      "answered as not run (0: no limit)")
    max_tool_errors: int = Field(default=0, ge=0, le=1000, description="malformed tool calls answered with the "
                                                                       "error as the tool's result, so the model can "
                                                                       "try again; the next one ends the rollout as "
                                                                       "a policy error (0: the first one does)")


class SessionSettings(Spec):
    """A sandbox held for the whole trajectory (workers/sandbox/session.py): files, installed packages and the
    working directory persist between tool calls."""

    idle_timeout: float = Field(default=600, gt=0, le=86_400, description="seconds without a tool call before the "
                                                                          "sandbox is taken back (an infra error)")
    lifetime: float = Field(default=3600, gt=0, le=7 * 86_400, description="hard limit on the session's seconds")
    max_calls: int = Field(default=200, ge=1, le=100_000, description="sandbox calls in the session (the "
                                                                      "trajectory ends when they are spent)")
    disk_mb: int = Field(default=1024, ge=16, le=1_048_576, description="the workspace's writable space")
    memory_mb: int = Field(default=1024, ge=64, le=1_048_576, description="memory of the session's processes")
    call_seconds: float = Field(default=120, gt=0, le=86_400, description="wall-clock limit of one call")
    keep_background: bool = Field(default=False, description="processes a call leaves running outlive it")
    prepare: list[Annotated[str, Field(min_length=1, max_length=10_000)]] = Field(
        default_factory=list, max_length=50, description="shell commands run once in the workspace (no network) "
                                                         "before the first session; cached per image")


class ContextPolicy(Spec):
    """What happens when the conversation outgrows the model's context: end the rollout, or drop / truncate the
    oldest tool outputs, always keeping the prompt and the last turns."""

    when_full: Literal["end", "drop_tool_outputs", "truncate_tool_outputs"] = "end"
    keep_last_turns: int = Field(default=4, ge=1, le=1000, description="the newest turns kept whole")
    truncated_chars: int = Field(default=200, ge=0, le=100_000, description="what is left of an older tool output "
                                                                            "(truncate_tool_outputs)")


class ExampleMessage(Spec):
    role: Literal["user", "assistant", "tool"]
    content: str = Field(min_length=1)


MAX_GENERATED_INSTANCES = 10_000


class GeneratorSpec(Spec):
    """Instances made by a procedural generator instead of uploaded: a library's dataset, its configuration, a seed
    and a size, materialised when the version is published (workers/rl/tasks/generators.py), the same instances on
    every host. `version` is the library's release they were made with: a host with another release installed
    refuses to materialise them, so a new release is a new version of the template, never a silent change."""

    library: Literal["reasoning-gym"] = Field(description="the generator library")
    version: str = Field(pattern=r"^[0-9][0-9A-Za-z.+!-]{0,40}$", description="the library's release that made "
                                                                             "the instances, e.g. 0.1.25")
    dataset: str = Field(pattern=r"^[a-z][a-z0-9_]{0,62}$", description="the library's name of the dataset")
    config: dict[str, Any] = Field(default_factory=dict, description="the dataset's own configuration (its keyword "
                                                                     "arguments, seed and size apart)")
    seed: int = Field(default=0, ge=0, le=2**31 - 1)
    size: int = Field(ge=1, le=MAX_GENERATED_INSTANCES, description="how many instances: indices 0 to size-1")

    @field_validator("config")
    @classmethod
    def seed_and_size_apart(cls, config: dict[str, Any]) -> dict[str, Any]:
        named = sorted({"seed", "size"} & set(config))
        if named:
            raise ValueError(f"{' and '.join(named)} are fields of the generator, not of its config")
        return config


class TaskTemplateSpec(GrownSpec):
    ADDED_LATER = ("examples", "session", "context", "generator")

    system_prompt: str = Field(default="", description="shown before everything else; literal text")
    # A worked exchange shown before every instance's prompt, as earlier turns of the conversation (few-shot as
    # multi-turn, lm-evaluation-harness' fewshot_as_multiturn): a small model copies a tool call it has seen
    # made far more often than one it is told to make. Literal text, not a format string.
    examples: list[ExampleMessage] = Field(default_factory=list, description="earlier turns shown before the prompt: "
                                           "user first, assistant last, tool results after an assistant turn")
    prompt_template: str = Field(min_length=1, description="Python format string over the instance inputs")
    tools: list[ToolSpec] = Field(default_factory=list, description="the tools the model may call (JSON Schema "
                                                                    "parameters); they run in the sandbox image")
    sandbox_image: Ref = Field(description="the sandbox image tool calls and checks run in: slug, slug@N or "
                                           "slug@alias")
    verifier: Ref = Field(description="the verifier that scores an answer: slug, slug@N or slug@alias")
    limits: Limits = Field(default_factory=Limits, description="turns, tokens and seconds a rollout may use")
    session: SessionSettings | None = Field(default=None, description="hold one sandbox for the whole rollout: "
                                                                      "its workspace persists between tool calls")
    context: ContextPolicy | None = Field(default=None, description="what to do when the conversation outgrows "
                                                                    "the model's context (default: end the rollout)")
    generator: GeneratorSpec | None = Field(default=None, description="the instances come from a generator "
                                                                      "library, materialised when published")

    @field_validator("prompt_template")
    @classmethod
    def prompt_parses(cls, template: str) -> str:
        prompt_placeholders(template)
        return template

    @field_validator("examples")
    @classmethod
    def examples_are_a_conversation(cls, examples: list[ExampleMessage]) -> list[ExampleMessage]:
        if not examples:
            return examples
        if examples[0].role != "user" or examples[-1].role != "assistant":
            raise ValueError("examples begin with a user turn and end with an assistant turn")
        for before, message in zip(examples, examples[1:], strict=False):
            if message.role == before.role and message.role != "tool":
                raise ValueError(f"two {message.role} turns in a row; user and assistant turns alternate")
            if message.role == "tool" and before.role not in ("assistant", "tool"):
                raise ValueError("a tool result follows the assistant turn that called the tool")
        return examples

    @field_validator("tools")
    @classmethod
    def tool_names_distinct(cls, tools: list[ToolSpec]) -> list[ToolSpec]:
        names = [t.name for t in tools]
        if len(names) != len(set(names)):
            raise ValueError("two tools share a name")
        return tools


def prompt_placeholders(template: str) -> set[str]:
    """The input names a prompt template uses; raises ValueError on a malformed template."""
    names = set()
    try:
        for _, field_name, _, _ in string.Formatter().parse(template):
            if field_name is None:
                continue
            if not field_name.isidentifier():
                raise ValueError(f"placeholder {{{field_name}}} must be a plain input name")
            names.add(field_name)
    except ValueError as exc:
        raise ValueError(f"prompt_template is not a valid format string: {exc} (write {{{{ and }}}} for braces)")
    return names


# --- sandbox image ----------------------------------------------------------------------------------------


class BaseLayer(Spec):
    type: Literal["base"]
    image: str = Field(min_length=1, description="a base rootfs name, e.g. python-3.11-slim")


class SystemPackagesLayer(Spec):
    type: Literal["system_packages"]
    packages: list[Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9+.-]*(=[A-Za-z0-9.+:~-]+)?$")]] = Field(min_length=1)


# name[extras]==version: an exact pin, so an image's content hash names what it installs.
PINNED_REQUIREMENT = r"^[A-Za-z0-9][A-Za-z0-9._-]*(\[[A-Za-z0-9_,.-]+\])?(==[A-Za-z0-9.+!*-]+)?$"


class PythonPackagesLayer(Spec):
    type: Literal["python_packages"]
    packages: list[Annotated[str, Field(pattern=PINNED_REQUIREMENT)]] = Field(
        min_length=1, description="pinned requirements, e.g. numpy==2.1.3"
    )


class FilesLayer(Spec):
    type: Literal["files"]
    files: dict[Annotated[str, Field(pattern=r"^[A-Za-z0-9_./-]+$")], str] = Field(
        min_length=1, description="relative path inside the sandbox -> content",
        json_schema_extra={"propertyNames": {"pattern": r"^(?!/)(?!.*(^|/)\.\.(/|$))[A-Za-z0-9_./-]+$"}},
    )

    @field_validator("files")
    @classmethod
    def paths_stay_inside(cls, files: dict[str, str]) -> dict[str, str]:
        escaping = sorted(p for p in files if p.startswith("/") or ".." in p.split("/"))
        if escaping:
            raise ValueError(f"paths must be relative and stay inside the sandbox: {', '.join(escaping)}")
        return files


class SetupScriptLayer(Spec):
    type: Literal["setup_script"]
    script: str = Field(min_length=1)


Layer = Annotated[
    Union[BaseLayer, SystemPackagesLayer, PythonPackagesLayer, FilesLayer, SetupScriptLayer],
    Field(discriminator="type"),
]


class ResourceLimits(Spec):
    cpus: float = Field(default=1, gt=0, le=64)
    cpu_seconds: float = Field(default=30, gt=0, le=86_400)
    memory_mb: int = Field(default=512, ge=16, le=1_048_576)
    wall_seconds: float = Field(default=60, gt=0, le=86_400)
    max_processes: int = Field(default=64, ge=1, le=65_536)
    disk_mb: int = Field(default=256, ge=1, le=1_048_576)
    network: bool = False


def _base_layer_first(schema: dict) -> None:
    """Say in the JSON Schema what `starts_with_one_base` checks: the base layer first, and only there."""
    layers = schema["properties"]["layers"]
    base, *others = layers["items"]["oneOf"]
    layers["prefixItems"] = [base]
    layers["items"] = {"oneOf": others}


class SandboxImageSpec(Spec):
    model_config = ConfigDict(json_schema_extra=_base_layer_first)

    layers: list[Layer] = Field(min_length=1)
    limits: ResourceLimits = Field(default_factory=ResourceLimits)
    warm_pool_size: int = Field(default=2, ge=0, le=256)

    @field_validator("layers")
    @classmethod
    def starts_with_one_base(cls, layers: list) -> list:
        if layers[0].type != "base":
            raise ValueError("the first layer must be the base layer (type: base)")
        if any(layer.type == "base" for layer in layers[1:]):
            raise ValueError("only the first layer may be a base layer")
        return layers


# --- verifier ---------------------------------------------------------------------------------------------


class Check(Spec):
    name: str = Field(default="", max_length=100, description="shown in verdicts; defaults to the check's type")
    weight: Weight = Field(default=1.0, description="0 means log only")


class StringCheck(Check):
    type: Literal["string_check"]
    operation: Literal["eq", "ne", "like", "ilike"] = "eq"
    reference: str = Field(default="{answer}", description="format string over the instance's hidden fields")


class TextSimilarity(Check):
    type: Literal["text_similarity"]
    metric: Literal["fuzzy_match", "bleu", "rouge_l", "cosine"] = "fuzzy_match"
    reference: str = "{answer}"
    pass_threshold: Fraction = 0.8


class NumericMatch(Check):
    type: Literal["numeric"]
    reference: str = "{answer}"
    abs_tolerance: float = Field(default=0, ge=0)
    rel_tolerance: float = Field(default=1e-9, ge=0)
    parse_scale: bool = True  # "1.2 million", "15%"


class MathMatch(Check):
    type: Literal["math"]
    reference: str = "{answer}"
    timeout_seconds: float = Field(default=5, gt=0, le=60)


class RegexMatch(Check):
    type: Literal["regex"]
    pattern: str = Field(min_length=1)

    @field_validator("pattern")
    @classmethod
    def compiles(cls, pattern: str) -> str:
        import re

        try:
            re.compile(pattern)
        except re.error as exc:
            raise ValueError(f"not a valid regular expression: {exc}")
        return pattern


class JsonSchemaCheck(Check):
    type: Literal["json_schema"]
    json_schema: dict[str, Any]


class UnitTests(Check):
    type: Literal["unit_tests"]
    framework: Literal["pytest", "unittest"] = "unittest"
    timeout_seconds: float = Field(default=30, gt=0, le=3600)
    # fraction: the share of hidden tests passed; all: 1 only if every test passes. With `fraction`, a stub that
    # answers nothing still collects the tests that any harmless function passes (arguments left unchanged).
    scoring: Literal["fraction", "all"] = "fraction"


class RepositoryTests(Check):
    """A repository task's verdict: the workspace's diff replayed on the base snapshot in a fresh sandbox, test
    files as the base has them, the hidden test patch applied; 1 only if every FAIL_TO_PASS and PASS_TO_PASS test
    passes (workers/verifiers/repository.py)."""

    type: Literal["repository_tests"]
    timeout_seconds: float = Field(default=120, gt=0, le=3600, description="for the whole test run")


class PythonGrader(Check):
    type: Literal["python_grader"]
    source: str = Field(min_length=1, description="defines grade(sample, item) -> float")
    timeout_seconds: float = Field(default=10, gt=0, le=600)

    @field_validator("source")
    @classmethod
    def defines_grade(cls, source: str) -> str:
        import ast

        try:
            tree = ast.parse(source)
        except SyntaxError as exc:
            raise ValueError(f"Python syntax error on line {exc.lineno}: {exc.msg}")
        if not any(isinstance(n, ast.FunctionDef) and n.name == "grade" for n in tree.body):
            raise ValueError("must define a top-level function grade(sample, item)")
        return source


class GeneratorScore(Check):
    """A generated task's own scoring: the generator library's function for the task's dataset (reasoning-gym's
    `score_answer`), run in the sandbox on the answer the library's convention takes from the response
    (workers/verifiers/generated.py)."""

    type: Literal["generator_score"]
    timeout_seconds: float = Field(default=10, gt=0, le=600)


class LogRule(Spec):
    pattern: str = Field(min_length=1)
    effect: Literal["fail", "pass"] = "fail"


class LogRules(Check):
    type: Literal["log_rules"]
    rules: list[LogRule] = Field(min_length=1)


class MeshGeometry(Check):
    type: Literal["mesh_geometry"]
    require_watertight: bool = True
    volume_rel_tolerance: float = Field(default=0.02, ge=0, le=1)
    bbox_abs_tolerance: float = Field(default=0.01, ge=0)
    iou_threshold: Fraction = 0.9
    render_views: list[Literal["front", "side", "top", "iso"]] = Field(default_factory=lambda: ["iso"])


class Citations(Check):
    type: Literal["citations"]
    fuzzy_threshold: Fraction = 0.9
    check_numbers: bool = True


class ScoreModel(Check):
    type: Literal["score_model"]
    model: str = Field(min_length=1)
    rubric: str = Field(min_length=1)
    score_range: tuple[float, float] = (0.0, 1.0)
    pairwise: bool = Field(default=False, description="compare with `reference` in both orders, not score alone")
    reference: str = Field(default="{answer}", description="pairwise: format string over the hidden fields")

    @field_validator("score_range")
    @classmethod
    def low_to_high(cls, bounds: tuple[float, float]) -> tuple[float, float]:
        if not bounds[0] < bounds[1]:
            raise ValueError(f"must go from low to high, not {list(bounds)}")
        return bounds


class LabelModel(Check):
    type: Literal["label_model"]
    model: str = Field(min_length=1)
    prompt: str = Field(min_length=1)
    labels: list[str] = Field(min_length=2)
    passing_labels: list[str] = Field(min_length=1)

    @model_validator(mode="after")
    def passing_are_labels(self):
        unknown = sorted(set(self.passing_labels) - set(self.labels))
        if unknown:
            raise ValueError(f"passing_labels {unknown} are not among labels {self.labels}")
        return self


CHECKS_BY_LAYER = {
    "exact": {"string_check", "text_similarity", "numeric", "math", "regex", "json_schema", "unit_tests",
              "python_grader", "generator_score"},
    "environment": {"log_rules", "mesh_geometry", "citations", "python_grader", "repository_tests"},
    "judge": {"score_model", "label_model"},
}

CheckSpec = Annotated[
    Union[StringCheck, TextSimilarity, NumericMatch, MathMatch, RegexMatch, JsonSchemaCheck, UnitTests, PythonGrader,
          LogRules, MeshGeometry, Citations, ScoreModel, LabelModel, RepositoryTests, GeneratorScore],
    Field(discriminator="type"),
]


class Escalation(Spec):
    """A layer score inside [low, high) is uncertain and goes on to the next layer; outside it decides."""

    uncertain_low: Fraction
    uncertain_high: Fraction

    @model_validator(mode="after")
    def ordered(self):
        if self.uncertain_low > self.uncertain_high:
            raise ValueError("uncertain_low must not exceed uncertain_high")
        return self


class VerifierLayer(Spec):
    name: str = Field(pattern=r"^[a-z][a-z0-9_-]{0,40}$", description="names the layer in verdicts")
    kind: Literal["exact", "environment", "judge"] = Field(
        description="exact: checks of the answer itself; environment: of what the sandbox produced; judge: an "
                    "LLM's verdict. Layers run in this order, cheapest first")
    checks: list[CheckSpec] = Field(min_length=1, description="the layer's score is their weighted mean")
    escalate: Escalation | None = Field(default=None, description="scores inside [uncertain_low, uncertain_high) "
                                                                  "go on to the next layer instead of deciding")
    continue_on_pass: bool = Field(
        default=False, description="a pass here goes on to the next layer instead of deciding (a failure still "
                                   "decides): cheap checks filter, later layers scrutinise what got through")

    @model_validator(mode="after")
    def checks_fit_layer(self):
        allowed = CHECKS_BY_LAYER[self.kind]
        wrong = [c.type for c in self.checks if c.type not in allowed]
        if wrong:
            raise ValueError(f"a {self.kind} layer cannot hold {', '.join(wrong)}; "
                             f"it takes {', '.join(sorted(allowed))}")
        if all(c.weight == 0 for c in self.checks):
            raise ValueError("at least one check needs a weight above 0")
        return self


class VerifierSpec(Spec):
    """Scores a response to a task: layers run cheapest first, and the first one that decides gives the reward."""

    layers: list[VerifierLayer] = Field(min_length=1, description="exact layers first, then environment, then judge")
    pass_threshold: Fraction = Field(default=1.0, description="a reward at or above this counts as a pass")

    @model_validator(mode="after")
    def escalation_has_somewhere_to_go(self):
        if self.layers[-1].escalate is not None or self.layers[-1].continue_on_pass:
            raise ValueError(f"the last layer ({self.layers[-1].name}) cannot escalate or continue: no layer "
                             "follows it")
        names = [layer.name for layer in self.layers]
        if len(names) != len(set(names)):
            raise ValueError("two layers share a name")
        order = ["exact", "environment", "judge"]
        ranks = [order.index(layer.kind) for layer in self.layers]
        if ranks != sorted(ranks):
            raise ValueError("layers run cheapest first: exact, then environment, then judge")
        return self


# --- bundle -----------------------------------------------------------------------------------------------


class ResolvedMember(Spec):
    ref: VersionRef
    content_hash: str = Field(pattern=r"^[0-9a-f]{64}$")


class EvaluationSettings(Spec):
    """A bundle marked for evaluation (an eval suite): how each model answers it. Part of the suite's
    comparability key with the pinned closure: two scores are compared only under the same settings."""

    samples_per_task: int = Field(default=1, ge=1, le=64, description="answers per task (pass@k needs more than 1)")
    temperature: float = Field(default=0.0, ge=0, le=2, description="0: greedy, the usual for a leaderboard")
    tasks_per_template: int = Field(default=0, ge=0, le=1_000_000,
                                    description="0: every task instance; else a seeded sample of this many")
    seed: int = Field(default=0, ge=0, le=2**31 - 1)


class BundleSpec(GrownSpec):
    ADDED_LATER = ("run_config", "evaluation")

    members: list[VersionRef] = Field(min_length=1)
    # Filled on publish: the full closure (templates of domains, images and verifiers of templates, members of
    # included bundles) with each content hash, so a bundle pins everything a run needs.
    resolved: list[ResolvedMember] = Field(default_factory=list)
    # The run settings its tasks are sized for (the model, its engine, LoRA ...: fields of the kinds' configs,
    # workers/rl/config.py), which a run on this bundle starts from, each kind taking its own; the run's own settings
    # override them. Checked on publish (apps/registry).
    run_config: dict[str, Any] = Field(default_factory=dict)
    # Set on an eval suite: a bundle whose tasks are evaluated, not trained on (apps/evals).
    evaluation: EvaluationSettings | None = None


# --- model ------------------------------------------------------------------------------------------------


class BuiltinModelSource(Spec):
    type: Literal["builtin"]
    name: Literal["demo-tiny"] = Field(description="the project's own character model, pretrained here from the "
                                                   "run's tasks on first use")


class PackageModelSource(Spec):
    type: Literal["package"]
    name: str = Field(pattern=SLUG_RE, description="a model shipped in a Python package that `make setup` "
                                                   "installs, e.g. smollm2-135m-instruct; converted on first use")


class LocalModelSource(Spec):
    type: Literal["local"]
    path: str = Field(min_length=2, max_length=500, pattern=r"^/[^\x00]*$",
                      description="an absolute path to a Hugging Face model directory inside the model "
                                  "directories (STUDIO_MODEL_DIRS) of every worker")


ModelSource = Annotated[Union[BuiltinModelSource, PackageModelSource, LocalModelSource], Field(discriminator="type")]


class ModelSpec(Spec):
    """A base model a run starts from. A run pins the version, and with it the weights' content hash: a worker
    whose copy of the weights hashes otherwise refuses to train (apps/common/wiring.py)."""

    source: ModelSource
    weights_sha256: str = Field(default="", pattern=r"^([0-9a-f]{64})?$",
                                description="sha256 of the weights (a package's file; a directory's weight files "
                                            "in name order); filled in on publish where the registry can read them")
    chat_template: str = Field(default="", max_length=100_000,
                               description="a Jinja chat template replacing the tokenizer's own (empty: its own)")
    context_length: int | None = Field(default=None, ge=16, le=10_000_000,
                                       description="the longest context (prompt and completion) used; empty: the "
                                                   "model's own")
    licence: str = Field(default="", max_length=200, description="e.g. Apache-2.0")


# --- rubric -----------------------------------------------------------------------------------------------

RUBRIC_LABEL_RE = r"^[a-z0-9][a-z0-9_-]{0,39}$"


# What `labels_fit_the_type` checks, in the JSON Schema: labels for labels and ordinal questions, none otherwise.
_LABELS_FIT_THE_TYPE = {
    "if": {"properties": {"type": {"enum": ["labels", "ordinal"]}}},
    "then": {"properties": {"labels": {"minItems": 2, "uniqueItems": True}}, "required": ["labels"]},
    "else": {"properties": {"labels": {"maxItems": 0}}},
}


class RubricQuestion(Spec):
    """One question a reviewer answers. pass_fail: true or false; labels: one of `labels` (nominal);
    ordinal: one of `labels`, ordered from worst to best (agreement weighs near misses less); text: free text,
    never part of agreement."""

    model_config = ConfigDict(json_schema_extra=_LABELS_FIT_THE_TYPE)

    key: str = Field(pattern=r"^[a-z][a-z0-9_]{0,39}$", description="names the answer in labels and exports")
    type: Literal["pass_fail", "labels", "ordinal", "text"]
    prompt: str = Field(min_length=1, max_length=500, description="the question as the reviewer reads it")
    instructions: str = Field(default="", max_length=5000)
    labels: list[Annotated[str, Field(pattern=RUBRIC_LABEL_RE)]] = Field(default_factory=list, max_length=9)
    scope: Literal["trajectory", "step"] = Field(
        default="trajectory", description="trajectory: asked once per item; step: asked of one turn, tool call or "
                                          "verifier component the reviewer points at")
    required: bool = True

    @model_validator(mode="after")
    def labels_fit_the_type(self):
        if self.type in ("labels", "ordinal"):
            if len(self.labels) < 2:
                raise ValueError(f"a {self.type} question needs at least 2 labels (keys 1-9 choose them)")
            if len(set(self.labels)) != len(self.labels):
                raise ValueError("two labels are the same")
        elif self.labels:
            raise ValueError(f"a {self.type} question takes no labels")
        return self


class RubricSpec(Spec):
    questions: list[RubricQuestion] = Field(min_length=1, max_length=20)

    @field_validator("questions")
    @classmethod
    def keys_distinct(cls, questions: list[RubricQuestion]) -> list[RubricQuestion]:
        keys = [q.key for q in questions]
        if len(keys) != len(set(keys)):
            raise ValueError("two questions share a key")
        return questions


# --- dataset ----------------------------------------------------------------------------------------------

SHA256_RE = r"^[0-9a-f]{64}$"
DATASET_FORMATS = ("sft", "preference")


class TrajectoriesSource(Spec):
    """Archived trajectories that every filter given selects (the trajectory browser's filters), their
    conversations as SFT rows."""

    type: Literal["trajectories"]
    run: str = Field(default="", max_length=200, description="a run's name or id (empty: every run)")
    domain: str = Field(default="", max_length=63, pattern=r"^([a-z0-9][a-z0-9-]{0,62})?$")
    reward_min: float | None = Field(default=None, ge=-1e6, le=1e6, description="only rewards at or above this")
    verdict_status: Literal["", "pass", "fail", "partial"] = ""
    deciding_layer: str = Field(default="", max_length=64, description="the verifier layer that decided")
    accepted_in: str = Field(default="", pattern=rf"^({SLUG_RE})?$",
                             description="a review queue: only what its reviewers accepted (or its adjudicator)")
    question: str = Field(default="verdict", max_length=40, description="with accepted_in: the question that decides")
    accept: str = Field(default="correct", max_length=40, description="with accepted_in: the answer that accepts")
    limit: int = Field(default=10_000, ge=1, le=1_000_000, description="the most rows taken, newest first")


class ReviewPairsSource(Spec):
    """A review queue's preference pairs: an accepted trajectory over a sibling of its group that was labelled
    otherwise, or scored lower (apps/review/exports.py)."""

    type: Literal["review_pairs"]
    queue: str = Field(pattern=rf"^{SLUG_RE}$")
    question: str = Field(default="verdict", max_length=40)
    accept: str = Field(default="correct", max_length=40)


class ReferenceCheckSource(Spec):
    """The trajectories of a bundle's newest completed reference check (its tasks' own answers, verified)."""

    type: Literal["reference_check"]
    bundle: str = Field(pattern=rf"^{SLUG_RE}$", description="the bundle slug the reference check ran on")
    passed_only: bool = Field(default=True, description="only the references that passed their verifier")
    tool_calls_only: bool = Field(default=False, description="only the trajectories that called a tool")
    template: str = Field(default="", pattern=rf"^({SLUG_RE})?$", description="only this task template's")


class UploadSource(Spec):
    """A JSONL file uploaded in the chat-messages format TRL and OpenAI fine-tuning read, stored by its hash."""

    type: Literal["upload"]
    name: str = Field(min_length=1, max_length=200, description="the file's name as uploaded")
    sha256: str = Field(pattern=SHA256_RE, description="the stored upload's content hash")


DatasetSource = Annotated[Union[TrajectoriesSource, ReviewPairsSource, ReferenceCheckSource, UploadSource],
                          Field(discriminator="type")]
SOURCES_BY_FORMAT = {"sft": {"trajectories", "reference_check", "upload"},
                     "preference": {"review_pairs", "upload"}}


class DatasetSpec(Spec):
    """A training dataset: where its rows come from, and — filled in by the build that materialised them
    (apps/datasets) — the content hash of the rows it holds. A version pins that hash: its rows never change,
    however the archive grows."""

    format: Literal["sft", "preference"] = Field(description="sft: messages; preference: prompt, chosen and "
                                                            "rejected (TRL's conversational formats)")
    sources: list[DatasetSource] = Field(min_length=1, max_length=20)
    exclude_eval_tasks: bool = Field(default=True, description="leave out every task an eval suite asks")
    content_sha256: str = Field(pattern=SHA256_RE, description="sha256 of the materialised JSONL (set by a build)")
    rows: int = Field(ge=0, le=100_000_000, description="rows in the materialised JSONL (set by a build)")
    left_out: dict[str, int] = Field(default_factory=dict, description="rows left out by cause: duplicates, "
                                                                       "eval_tasks (set by a build)")

    @model_validator(mode="after")
    def sources_fit_the_format(self):
        wrong = sorted({s.type for s in self.sources} - SOURCES_BY_FORMAT[self.format])
        if wrong:
            raise ValueError(f"a {self.format} dataset cannot take {', '.join(wrong)} sources; it takes "
                             f"{', '.join(sorted(SOURCES_BY_FORMAT[self.format]))}")
        return self


SPEC_MODELS: dict[str, type[Spec]] = {
    "domain": DomainSpec,
    "task_template": TaskTemplateSpec,
    "sandbox_image": SandboxImageSpec,
    "verifier": VerifierSpec,
    "bundle": BundleSpec,
    "model": ModelSpec,
    "rubric": RubricSpec,
    "dataset": DatasetSpec,
}


def _field_path(loc: tuple, data: Any) -> str:
    """pydantic's loc mixes real fields with union tags and validator names; keep what is in the data,
    plus a last item naming a field that is missing."""
    parts: list[str] = []
    node = data
    for position, item in enumerate(loc):
        if isinstance(node, dict) and node.get("type") == item and position < len(loc) - 1:
            continue  # the discriminator tag of a union member, not a field
        if isinstance(item, int) and isinstance(node, list) and item < len(node):
            parts.append(f"[{item}]")
            node = node[item]
        elif isinstance(node, dict) and item in node:
            parts.append(("." if parts else "") + str(item))
            node = node[item]
        elif position == len(loc) - 1 and isinstance(item, str):
            parts.append(("." if parts else "") + item)
    return "".join(parts)


PATTERN_HINTS = {
    REF_RE: "expected slug, slug@N or slug@alias (lowercase letters, digits, hyphens)",
    VERSION_REF_RE: f"expected kind/slug@N or kind/slug@alias, kind one of {', '.join(KINDS)}",
}


def _fields_at(model: type[BaseModel], loc: tuple) -> list[str]:
    """The field names of the model that `loc` (pydantic's, without its last item) ends in, to name them beside
    an unknown field; [] where the path cannot be followed (a free-form mapping)."""
    current: Any = model
    for item in loc:
        current = _unwrapped(current)
        if isinstance(current, tuple):  # a discriminated union: pydantic's loc names the member by its tag
            tagged = [m for m in current if "type" in m.model_fields
                      and item in typing.get_args(m.model_fields["type"].annotation)]
            if not tagged:
                return []
            current = tagged[0]
        elif isinstance(item, int) and typing.get_origin(current) in (list, tuple):
            current = typing.get_args(current)[0]
        elif isinstance(current, type) and issubclass(current, BaseModel) and item in current.model_fields:
            current = current.model_fields[item].annotation
        else:
            return []
    current = _unwrapped(current)
    return list(current.model_fields) if isinstance(current, type) and issubclass(current, BaseModel) else []


def _unwrapped(annotation: Any) -> Any:
    """Annotated and Optional removed; a union of models as a tuple of them."""
    while True:
        origin = typing.get_origin(annotation)
        if origin is Annotated:
            annotation = typing.get_args(annotation)[0]
        elif origin is Union or origin is types.UnionType:
            members = [a for a in typing.get_args(annotation) if a is not type(None)]
            if len(members) != 1:
                return tuple(m for m in members if isinstance(m, type) and issubclass(m, BaseModel))
            annotation = members[0]
        else:
            return annotation


def _problem(error: dict, model: type[BaseModel] | None = None) -> str:
    kind = error["type"]
    if kind == "extra_forbidden":
        try:
            known = _fields_at(model, tuple(error["loc"][:-1])) if model else []
        except (TypeError, AttributeError, IndexError):  # a shape this walk does not know: say less, never fail
            known = []
        return f"unknown field; the fields here are {', '.join(known)}" if known else "unknown field"
    if kind == "union_tag_invalid":
        return f"unknown type {error['input'].get('type')!r}; expected one of {error['ctx']['expected_tags']}"
    if kind == "union_tag_not_found":
        return "missing 'type'"
    if kind == "string_pattern_mismatch" and error["ctx"]["pattern"] in PATTERN_HINTS:
        return f"{error['input']!r} is not valid: {PATTERN_HINTS[error['ctx']['pattern']]}"
    return error["msg"].removeprefix("Value error, ")


def validate_spec(kind: str, data: Any) -> dict:
    return parse_spec(kind, data).model_dump(mode="json")


def parse_spec(kind: str, data: Any) -> Spec:
    """The spec as its typed object (what `validate_spec` normalises), or SpecError."""
    if kind not in SPEC_MODELS:
        raise SpecError([FieldError("kind", f"unknown kind {kind!r}; expected one of {', '.join(KINDS)}")])
    if not isinstance(data, dict):
        raise SpecError([FieldError("spec", f"must be a mapping of fields, not {type(data).__name__}")])
    problem = data_problem(data)
    if problem:
        # Checked before pydantic: it would turn NaN into null in free-form fields (json_schema, tool parameters),
        # and deep data into a RecursionError.
        raise SpecError([FieldError("spec", problem)])
    try:
        return SPEC_MODELS[kind].model_validate(data)
    except ValidationError as exc:
        raise SpecError([FieldError(_field_path(e["loc"], data), _problem(e, SPEC_MODELS[kind]))
                         for e in exc.errors()]) from None

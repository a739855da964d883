"""Each kind of run's configuration: one dataclass per kind on a shared base, as TRL shapes its trainers' (a
`TrainingArguments` base, a `GRPOConfig`, an `SFTConfig` ... adding their own fields). A kind's class holds the
settings that kind reads, each with its default and its documentation (the string under it), and nothing else:

    RunConfig                          resolve, check, to_dict, from_dict: what every kind's config does
    ├── SandboxConfig                  tool calls in sandboxes, verification
    │   └── ReferenceCheckConfig       a bundle's reference answers checked (no model answers)
    └── PolicyConfig                   the model: its pins, device, precision, LoRA; the seed
        ├── RolloutConfig (+ Sandbox)  sampling: the engine, rollouts at once
        │   ├── EvaluationConfig       an eval suite answered (its plan)
        │   └── GRPOConfig (+ Training) groups, staleness, clipping, KL, curriculum, temperature ...
        └── TrainingConfig             the optimizer, its schedule, micro-batches, checkpoints, eval suite
            └── SFTConfig              the dataset, rows per step
                └── DPOConfig          β
    ExternalConfig                     a run trained elsewhere: what its trainer said of itself (no settings)

CONFIGS maps a run's kind to its class. A Run stores `CONFIGS[kind].resolve(overrides).to_dict()` — every field
of its kind present — so a run is reproducible from its row even after the defaults here change, and the config
hash names exactly what ran. `resolve` refuses a setting of another kind by name and says which kind reads it.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import hashlib
import inspect
import json
import math
import re
from dataclasses import dataclass, field
from typing import ClassVar, Literal

from workers.definitions.specs import FieldError


class ConfigError(ValueError):
    """Every problem with a set of overrides, each naming its field (the studio places each at its form field
    and in the API's answer)."""

    def __init__(self, errors: list[FieldError]):
        self.errors = list(errors)
        super().__init__("; ".join(map(str, self.errors)))


REFERENCE_MODEL = "builtin:reference"  # what a reference check once named as its model: the tasks' own answers
DEVICE = re.compile(r"^(auto|cpu|cuda(:[0-9]{1,2})?)$")
SHA256 = re.compile(r"[0-9a-f]{64}")
SERVER_URL = re.compile(r"https?://[^\s,/]+(/[^\s,]*)?")
# Pins a run's creation fills in (apps/runs/services.py: from its model definition, the checkpoint it starts from,
# its dataset, an evaluation's plan); nobody sets them by hand.
SET_BY_THE_STUDIO = ("model_version", "model_sha256", "evaluation", "start_from", "dataset_file", "dataset_sha256")
# What one run may ask of a worker. Far above what a single GPU node serves, far below what would exhaust one by
# accident (a typo of group_size=1e9 queues a run that can never take a step). A kind checks the bounds of its fields.
BOUNDS: dict[str, tuple[float, float]] = {
    "seed": (0, 2**63 - 1), "groups_per_step": (1, 4096), "group_size": (1, 1024), "max_staleness": (0, 64),
    "rollout_concurrency": (1, 4096), "verify_concurrency": (1, 1024), "oversampling": (1, 64),
    "speculative_tokens": (0, 16),
    "eval_suite_every": (0, 10_000_000), "temperature": (0, 10), "learning_rate": (0, 1),
    "warmup_steps": (0, 10_000_000), "weight_decay": (0, 10),
    "max_grad_norm": (0, 1e6), "micro_batch_size": (1, 65_536),
    "micro_batch_tokens": (0, 16_777_216), "clip_low": (0, 1), "clip_high": (0, 10),
    "kl_coef": (0, 100), "lora_rank": (0, 4096), "lora_alpha": (1, 65_536), "checkpoint_every": (1, 10_000_000),
    "keep_checkpoints": (1, 1000), "eval_tasks_per_domain": (0, 100_000), "max_tool_output_chars": (100, 1_000_000),
    "reference_per_template": (1, 1000), "data_parallel": (1, 64), "batch_size": (1, 65_536), "dpo_beta": (0, 100),
}


@dataclass(frozen=True)
class EndpointTarget:
    """An OpenAI-compatible endpoint an evaluation asks (apps/evals' Endpoint, as the evaluation pinned it)."""

    base_url: str
    model: str
    credential: str = ""  # the credential the key is read from where the work runs (apps/accounts/credentials.py)
    api_key_env: str = ""  # what plans pinned before credentials: any environment variable, so refused


@dataclass(frozen=True)
class EvaluationPlan:
    """What an evaluation run answers and how: its suite's decoding settings and comparability key, and what
    answers — the run's model (at a checkpoint of another run when `checkpoint` names its directory) or an
    endpoint. Set by apps/evals as EvaluationConfig.evaluation (stored as a dict, so a config's hash stays what it
    was); read through EvaluationConfig.evaluation_plan."""

    suite: str = ""
    key: str = ""
    samples_per_task: int = 1
    temperature: float = 0.0
    tasks_per_template: int = 0
    seed: int = 0
    checkpoint: str = ""
    checkpoint_step: int = 0
    endpoint: EndpointTarget | None = None
    pretrained_on: str = ""
    """The bundle whose tasks the evaluated model is built from, as a run on it builds it (empty: the suite's)."""

    @classmethod
    def from_dict(cls, data: dict) -> EvaluationPlan:
        values = {name: data[name] for name in EVALUATION_KEYS if name in data}
        if values.get("endpoint"):
            values["endpoint"] = EndpointTarget(**values["endpoint"])
        else:
            values.pop("endpoint", None)
        return cls(**values)


EVALUATION_KEYS = frozenset(f.name for f in dataclasses.fields(EvaluationPlan))


@dataclass(frozen=True)
class RunConfig:
    """The shared base of every kind's config: how overrides become a checked config, and how a Run stores it.
    A kind's class adds its fields (through the classes below) and the checks of its own fields (`problems`)."""

    kind: ClassVar[str] = ""  # the run kind (apps/runs RunKind's value) whose config this is; "" for a shared base
    label: ClassVar[str] = ""  # the kind's name in a sentence: GRPO, evaluation
    title: ClassVar[str] = ""  # a run of the kind in a sentence: a GRPO run, an evaluation
    # Runs of the kind are started by the studio, from settings (a bundle's run_config, the form, the API); False: a
    # run trained elsewhere, whose config only records what its trainer said, so no bundle recommends it settings.
    launched_here: ClassVar[bool] = True

    @classmethod
    def names(cls) -> frozenset[str]:
        return frozenset(f.name for f in dataclasses.fields(cls))

    @classmethod
    def own(cls, settings: dict) -> dict:
        """The settings among `settings` that this kind has: what it takes from settings meant for runs of any
        kind (a bundle's run_config)."""
        names = cls.names()
        return {name: value for name, value in settings.items() if name in names}

    @classmethod
    def resolve(cls, overrides: dict | None = None) -> RunConfig:
        """Defaults with `overrides` applied and checked (ConfigError naming every problem: a value out of bounds
        or of the wrong type, a setting of another kind, a setting of none); a Run stores its `to_dict()`."""
        overrides = dict(overrides or {})
        known = {f.name for f in dataclasses.fields(cls)}
        errors = [FieldError(name, foreign(name, cls)) for name in overrides if name not in known]
        defaults, values = cls(), {}
        for name, value in overrides.items():
            if name not in known:
                continue
            default = getattr(defaults, name)
            if isinstance(default, bool):
                ok = isinstance(value, bool)
            elif isinstance(default, int):
                ok = isinstance(value, int) and not isinstance(value, bool)
            elif isinstance(default, float):
                ok = isinstance(value, int | float) and not isinstance(value, bool)
                value = float(value) if ok else value
            elif isinstance(default, dict):
                ok = isinstance(value, dict)
            else:
                ok = isinstance(value, str)
            if not ok:
                errors.append(FieldError(name, f"expected {type(default).__name__}, got {value!r}"))
            values[name] = value
        if not errors:
            config = cls(**values)
            errors = config.problems()
        if errors:
            raise ConfigError(errors)
        return config

    def to_dict(self) -> dict:
        """Every field, as a Run stores it and its config hash reads it."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> RunConfig:
        """A stored config. The settings this kind does not have are left out: a run stored before each kind had
        its own class holds every kind's."""
        return cls(**cls.own(data))

    def check(self) -> None:
        """ConfigError naming every problem of this config's values."""
        problems = self.problems()
        if problems:
            raise ConfigError(problems)

    def problems(self) -> list[FieldError]:
        """What is wrong with the values: the bounds of this kind's fields here; each class adds its own checks
        (calling this first)."""
        problems = []
        for name, (low, high) in BOUNDS.items():
            if not hasattr(self, name):
                continue
            value = getattr(self, name)
            if not (isinstance(value, int | float) and math.isfinite(value) and low <= value <= high):
                problems.append(FieldError(name, f"must be between {low:g} and {high:g}, not {value!r}"))
        return problems


@dataclass(frozen=True)
class SandboxConfig(RunConfig):
    """The settings of a kind whose tasks run their tool calls in sandboxes and have their answers verified:
    the reference check, evaluations and GRPO."""

    verify_concurrency: int = 4
    """Verifications running at once."""
    max_tool_output_chars: int = 2000
    """A tool result longer than this is cut (and says so) before it enters the context."""


@dataclass(frozen=True)
class ReferenceCheckConfig(SandboxConfig):
    """A reference check (apps/runs/attempts/reference.py): a bundle's own reference answers through the real
    sandboxes and verifiers. No model answers, nothing is trained."""

    kind: ClassVar[str] = "reference"
    label: ClassVar[str] = "reference check"
    title: ClassVar[str] = "a reference check"

    reference_per_template: int = 3
    """The reference answers checked per task template."""


@dataclass(frozen=True)
class PolicyConfig(RunConfig):
    """The model of a kind that has one (evaluations, SFT, DPO, GRPO): what it is and the exact weights pinned,
    where and in what arithmetic it runs, its LoRA shape, and the seed of what the run draws."""

    seed: int = 0
    """Seeds what the run draws: the tasks and samples (GRPO), the rows' order (SFT, DPO), new LoRA weights; the
    same seed and config give the same run (sync)."""
    model: str = "builtin:demo-tiny"
    """A model definition (model/SLUG, model/SLUG@N or @alias: the run pins its version and weights), another
    run's checkpoint (checkpoint RUN@STEP or checkpoint ALIAS: a training run starts from its weights,
    start_from), or directly: builtin:demo-tiny (pretrained here on first use), builtin:smollm2-135m-instruct (a
    real LLM from the package index, converted on first use) or the local path of a Hugging Face causal LM. A
    definition is replaced by what its source names when the run is created."""
    model_version: str = ""
    """Set by the studio: the model definition's exact version (model/SLUG@N) the run pinned, if any."""
    model_sha256: str = ""
    """Set by the studio: the hash of the weights the run pinned; a worker whose copy hashes otherwise refuses."""
    chat_template: str = ""
    """A Jinja chat template replacing the tokenizer's own (from the model definition; empty: its own)."""
    context_length: int = 0
    """The longest context (prompt and completion) the model is given (from the model definition; 0: the
    model's own)."""
    device: str = "auto"
    """cpu, cuda, cuda:1 ... or auto (cuda when available)."""
    precision: Literal["auto", "fp32", "bf16"] = "auto"
    """The trainer's arithmetic, and an engine's own copy of the weights: bf16 runs the forward and backward
    under bf16 autocast with fp32 weights and optimizer state; auto is bf16 on a GPU that has it, fp32 otherwise
    (a CPU)."""
    lora_rank: int = 0
    """LoRA rank through peft for Hugging Face models (0: train every weight)."""
    lora_alpha: int = 16
    """LoRA scaling (alpha / rank multiplies the adapter's update); used with lora_rank above 0."""

    def problems(self) -> list[FieldError]:
        problems = super().problems()
        if self.model == REFERENCE_MODEL:
            problems.append(FieldError("model", f"{REFERENCE_MODEL} is no model: a reference check answers with "
                                                "the tasks' own references (manage.py reference_check)"))
        if len(self.model) > 500:
            problems.append(FieldError("model", "a built-in name or a local path of at most 500 characters"))
        if not DEVICE.fullmatch(self.device):  # `$` alone lets a final newline through
            problems.append(FieldError("device", f"{self.device!r} is not auto, cpu, cuda or cuda:N"))
        if self.model_sha256 and not SHA256.fullmatch(self.model_sha256):
            problems.append(FieldError("model_sha256", "64 lowercase hexadecimal digits, or empty"))
        if self.context_length and not 16 <= self.context_length <= 10_000_000:
            problems.append(FieldError("context_length", "0 (the model's own) or from 16 to 10,000,000 tokens"))
        if self.precision not in ("auto", "fp32", "bf16"):
            problems.append(FieldError("precision", f"{self.precision!r} is not auto, fp32 or bf16"))
        return problems


@dataclass(frozen=True)
class RolloutConfig(PolicyConfig, SandboxConfig):
    """The settings of a kind whose model answers tasks in rollouts (evaluations, GRPO): the engine that samples
    and how many rollouts run at once. `manage.py serve` samples a model with these too."""

    mode: Literal["async", "sync"] = "async"
    """async: generation, tools, verification and training overlap; sync: sample → roll out → verify → train
    (the engine then samples from the trainer's own weights, with no copy; an evaluation is always sync)."""
    engine: Literal["torch", "transformers", "vllm"] = "torch"
    """Inference engine: torch (the built-in demo model, KV cache), transformers (any HF causal LM, the packaged
    ones included; a Hugging Face model given `torch` samples on transformers too), vllm (GPU)."""
    rollout_concurrency: int = 16
    """Groups rolled out at once (an evaluation: tasks), each running its tool calls in the sandbox pool. More
    than groups_per_step, so a few long rollouts (code, documents) do not hold every slot while short ones could
    be training."""
    speculative_tokens: int = 0
    """Speculative decoding from the context in the torch and transformers engines (and `serve` on them): at most
    this many tokens drafted per row and step from earlier occurrences of its last tokens in its prompt, tool
    results and answer, verified in one forward pass (engines/speculation.py; the samples' distribution and
    greedy answers are unchanged). 0, the default, turns it off: on 2 CPU cores it made 16 rows slower."""

    def problems(self) -> list[FieldError]:
        problems = super().problems()
        if self.mode not in ("async", "sync"):
            problems.append(FieldError("mode", f"{self.mode!r} is not async or sync"))
        if self.engine not in ("torch", "transformers", "vllm"):
            problems.append(FieldError("engine", f"{self.engine!r} is not torch, transformers or vllm"))
        if self.model == "builtin:demo-tiny" and self.engine != "torch":
            problems.append(FieldError("engine",
                                       f"the built-in demo model runs on the torch engine, not {self.engine}"))
        return problems


@dataclass(frozen=True)
class EvaluationConfig(RolloutConfig):
    """An evaluation (apps/evals, apps/runs/attempts/evaluation.py): an eval suite's tasks answered by a model, a
    run's checkpoint or an endpoint, as its plan says. Nothing is trained."""

    kind: ClassVar[str] = "evaluation"
    label: ClassVar[str] = "evaluation"
    title: ClassVar[str] = "an evaluation"

    evaluation: dict = field(default_factory=dict)
    """Set by the studio (apps/evals): the suite's decoding settings (samples_per_task, temperature,
    tasks_per_template, seed), its comparability key, and what answers — the model above, at a run's checkpoint
    (checkpoint: its directory), or an OpenAI-compatible endpoint (endpoint: base_url, model, credential)."""

    def problems(self) -> list[FieldError]:
        problems = super().problems()
        unknown = sorted(set(self.evaluation) - EVALUATION_KEYS)
        if unknown:
            problems.append(FieldError("evaluation", f"unknown settings {', '.join(unknown)}"))
        return problems

    @property
    def evaluation_plan(self) -> EvaluationPlan:
        return EvaluationPlan.from_dict(self.evaluation)


@dataclass(frozen=True)
class TrainingConfig(PolicyConfig):
    """The settings of a kind that trains its model (SFT, DPO, GRPO): where it starts from, the optimizer and its
    schedule, micro-batches, checkpoints, and the eval suite its checkpoints are evaluated on."""

    start_from: dict = field(default_factory=dict)
    """Set by the studio when `model` names another run's checkpoint (checkpoint RUN@STEP, or checkpoint ALIAS):
    {run, run_name, step}. The run starts from those weights, its model settings copied from that run
    (apps/runs/stages.py): "SFT, then GRPO" is two runs with this link."""
    learning_rate: float = 3e-4
    """AdamW's learning rate (above 0)."""
    lr_schedule: Literal["constant", "linear"] = "constant"
    """After the warmup: constant, or linear (decays to 0 at the run's last step)."""
    warmup_steps: int = 0
    """Steps over which the learning rate rises linearly to learning_rate (0: none)."""
    weight_decay: float = 0.0
    """AdamW's decoupled weight decay."""
    max_grad_norm: float = 1.0
    """Gradients are clipped to this global norm before each update."""
    micro_batch_size: int = 64
    """Sequences per forward/backward where no token budget applies (micro_batch_tokens; a CPU by default); a
    step's batch is accumulated over as many as it needs."""
    micro_batch_tokens: int = 0
    """Padded tokens (rows × the longest row) per forward/backward: whole groups are packed while they fit, a
    longer group is split. 0: by device — 32,768 on a GPU, where one large pass beats several small ones; none
    on a CPU, where micro_batch_size decides (a pass of one group computes its shared prompt once)."""
    checkpoint_every: int = 10
    """Steps between checkpoints (the last step always checkpoints)."""
    keep_checkpoints: int = 3
    """The newest checkpoints kept on disk; older ones are removed."""
    eval_suite: str = ""
    """An eval suite (a bundle slug, its newest version) to evaluate this run's checkpoints on: the last one, and
    with eval_suite_every N, every one at a multiple of N steps; each evaluation is queued as its checkpoint is
    saved (apps/evals)."""
    eval_suite_every: int = 0
    """With eval_suite: evaluate every checkpoint at a multiple of this many steps too (0: the last one only)."""

    def problems(self) -> list[FieldError]:
        problems = super().problems()
        if self.learning_rate <= 0:
            problems.append(FieldError("learning_rate", "must be above 0"))
        if self.lr_schedule not in ("constant", "linear"):
            problems.append(FieldError("lr_schedule", f"{self.lr_schedule!r} is not constant or linear"))
        return problems


@dataclass(frozen=True)
class SFTConfig(TrainingConfig):
    """Supervised fine-tuning (workers/rl/training/supervised_pipeline.py): the model trained on a dataset's
    conversations, in one process. Nothing is sampled."""

    kind: ClassVar[str] = "sft"
    label: ClassVar[str] = "SFT"
    title: ClassVar[str] = "an SFT run"

    dataset: str = ""
    """The training data: a dataset version (dataset/SLUG@N) or, from the command line only (`train --kind sft
    --dataset PATH`), a JSONL file in TRL's conversational formats (workers/rl/training/data_files.py). The run pins
    the file's sha256 (dataset_sha256) and refuses a file that changed."""
    dataset_file: str = ""
    """Set by the studio: the file the run reads (the path given, made absolute; or where the studio wrote the
    dataset version named)."""
    dataset_sha256: str = ""
    """Set by the studio: the sha256 of that file when the run was created; a file that changed is refused."""
    batch_size: int = 16
    """Rows per trainer step (conversations, or preference pairs); the data is reshuffled every pass over it."""

    def problems(self) -> list[FieldError]:
        problems = super().problems()
        if self.dataset_sha256 and not SHA256.fullmatch(self.dataset_sha256):
            problems.append(FieldError("dataset_sha256", "64 lowercase hexadecimal digits, or empty"))
        for name in ("dataset", "dataset_file"):
            if len(getattr(self, name)) > 1000:
                problems.append(FieldError(name, "a file path or dataset reference of at most 1,000 characters"))
        return problems


@dataclass(frozen=True)
class DPOConfig(SFTConfig):
    """DPO preference training: SFT's settings on a dataset of preference pairs, and β."""

    kind: ClassVar[str] = "dpo"
    label: ClassVar[str] = "DPO"
    title: ClassVar[str] = "a DPO run"

    dpo_beta: float = 0.1
    """β, how far the policy may move from the reference (the model the run starts from): the loss is
    -log σ(β · (chosen's log ratio to the reference - rejected's))."""

    def problems(self) -> list[FieldError]:
        problems = super().problems()
        if self.dpo_beta <= 0:
            problems.append(FieldError("dpo_beta", "must be above 0"))
        return problems


@dataclass(frozen=True)
class GRPOConfig(TrainingConfig, RolloutConfig):
    """GRPO training (workers/rl/pipeline.py): groups of rollouts sampled on the bundle's tasks, verified, and
    trained on with a clipped, group-relative loss (training/grpo.py)."""

    kind: ClassVar[str] = "grpo"
    label: ClassVar[str] = "GRPO"
    title: ClassVar[str] = "a GRPO run"

    groups_per_step: int = 8
    """Task groups per trainer step."""
    group_size: int = 8
    """Samples per task (the GRPO group)."""
    max_staleness: int = 1
    """async: how many policy versions a trajectory may lag the weights it is trained against. Generation is
    held back so nothing beyond this is produced; a trajectory that still arrives too late is not trained on (with
    partial_rollouts: its tokens sampled by weights more than this many versions old are not)."""
    partial_rollouts: bool = True
    """async: a trajectory in flight when new weights arrive goes on under them (AReaL's and slime's partial
    rollouts), each token recording the version and logprob it was sampled with; the staleness bound then holds
    per token: tokens older than max_staleness are left out of the loss, the newer ones trained on, and a group is
    dropped only when none of its tokens is fresh enough. Off: a trajectory is as stale as its oldest token, and a
    group past the bound is not trained on at all."""
    dynamic_sampling: bool = True
    """Fill each step with groups that carry signal (reward variance); the others are counted, not trained."""
    oversampling: int = 4
    """With dynamic sampling, a step consumes at most oversampling × groups_per_step groups looking for signal,
    then trains on the groups with signal it found, however few: a mix the policy cannot yet solve at all must
    not stall the run."""
    curriculum: bool = True
    """Draw tasks the policy always or never solves a tenth as often."""
    domain_weights: dict = field(default_factory=dict)
    """Per-domain sampling weights replacing the domains' own (domain slug -> weight)."""
    domain_quotas: dict = field(default_factory=dict)
    """Largest share of one step a domain may take (domain slug -> fraction)."""
    category_weights: dict = field(default_factory=dict)
    """Per-category factors on the weights of the category's domains (category -> factor; 0 leaves it out)."""
    category_quotas: dict = field(default_factory=dict)
    """Largest share of one step the domains of a category may take together (category -> fraction)."""
    temperature: float = 1.0
    """Sampling temperature of the rollouts (above 0; 1: the policy's own distribution)."""
    clip_low: float = 0.2
    """The policy ratio is clipped below at 1 - clip_low (PPO-style; below 1)."""
    clip_high: float = 0.28
    """The policy ratio is clipped above at 1 + clip_high: higher than clip_low, as in DAPO, so unlikely but
    good tokens can still gain probability."""
    normalize_std: bool = True
    """Divide each group's advantages by the group's reward std (off: Dr. GRPO, mean-centred only)."""
    kl_coef: float = 0.0
    """Weight of the k3 KL penalty to the initial policy (0: no reference model is kept)."""
    data_parallel: int = 1
    """Trainer processes on the worker's host, one per device (torchrun, training/distributed.py): each step's
    batch is sharded across them, their gradients summed, and rollouts sampled on every one of them unless
    inference servers generate. 1: the worker's own process."""
    inference_servers: str = ""
    """Generate the rollouts on OpenAI-compatible inference servers instead of in the trainer's process: their
    base URLs (http://host:port/v1), separated by spaces or commas — the studio's own `manage.py serve` of the
    same model, or vLLM servers with a weight-loading endpoint. The trainer publishes its weights to the blob
    storage after every step and tells each server to load them (engines/server.py). Empty: the engine above, in
    this process."""
    eval_tasks_per_domain: int = 64
    """Tasks per domain in the evaluation at the start and the end of the run (one sample each; 0: none). The
    summary's reward lift comes from it: training rewards are biased by the curriculum's choice of tasks."""

    def problems(self) -> list[FieldError]:
        problems = super().problems()
        if self.group_size < 2:
            problems.append(FieldError("group_size", "GRPO compares samples, so a group needs at least 2"))
        if self.clip_low >= 1:
            problems.append(FieldError("clip_low", "must be below 1"))
        if self.temperature <= 0:
            problems.append(FieldError("temperature", "must be above 0"))
        if self.data_parallel > 1 and self.device.startswith("cuda:"):
            problems.append(FieldError("device", f"a data-parallel run gives each process a device of its own; "
                                                 f"{self.device} names one (use cuda or auto)"))
        if len(self.inference_servers) > 4000 or any(not SERVER_URL.fullmatch(url) for url in self.server_urls()):
            problems.append(FieldError("inference_servers",
                                       "base URLs (http://host:port/v1) separated by spaces or commas"))
        for name in ("domain_weights", "category_weights"):
            if any(not isinstance(w, int | float) or not 0 <= w <= 1000 for w in getattr(self, name).values()):
                problems.append(FieldError(name, "weights must be numbers from 0 to 1000"))
        for name in ("domain_quotas", "category_quotas"):
            if any(not isinstance(q, int | float) or not 0 < q <= 1 for q in getattr(self, name).values()):
                problems.append(FieldError(name, "quotas must be fractions in (0, 1]"))
        return problems

    def server_urls(self) -> list[str]:
        """The inference servers' base URLs (engines/server.py), in the order given; none: in-process engine."""
        return [url for url in re.split(r"[\s,]+", self.inference_servers) if url]


@dataclass(frozen=True)
class ExternalConfig(RunConfig):
    """A run trained elsewhere (apps/runs/external.py): a trainer of its own (TRL, verifiers, verl ...) plays the
    bundle's environments through `manage.py environments serve`, and the studio records its episodes. The studio
    runs nothing of it, so there is nothing to set: the config records what the trainer said of itself."""

    kind: ClassVar[str] = "external"
    label: ClassVar[str] = "external"
    title: ClassVar[str] = "a run trained elsewhere"
    launched_here: ClassVar[bool] = False

    client: str = ""
    """The trainer's client of the environment server, as it named itself: trl, verifiers, verl or openenv."""
    trainer_model: str = ""
    """The model being trained, as its trainer names it (a Hugging Face id, a path on its cluster): the studio
    holds none of its weights, so it is a name only, never a model definition."""

    def problems(self) -> list[FieldError]:
        problems = super().problems()
        for name, longest in (("client", 40), ("trainer_model", 300)):
            if len(getattr(self, name)) > longest:
                problems.append(FieldError(name, f"at most {longest} characters"))
        return problems


# The one place a run's kind (apps/runs RunKind's values) names its config class.
CONFIGS: dict[str, type[RunConfig]] = {cls.kind: cls for cls in (
    GRPOConfig, SFTConfig, DPOConfig, EvaluationConfig, ReferenceCheckConfig, ExternalConfig)}
# The kinds whose settings a bundle's run_config recommends, and a setting of another kind names.
LAUNCHED_CONFIGS = [cls for cls in CONFIGS.values() if cls.launched_here]


def config_class(kind: str) -> type[RunConfig]:
    """The config class of runs of `kind`."""
    try:
        return CONFIGS[kind]
    except KeyError:
        raise ValueError(f"no run kind {kind!r}; the kinds are {', '.join(CONFIGS)}") from None


def foreign(name: str, config: type[RunConfig]) -> str:
    """Why `config`'s kind refuses setting `name`: which kinds read it ("group_size is a GRPO setting; an SFT run
    does not use it"), or that none does."""
    readers = [cls.label for cls in LAUNCHED_CONFIGS if name in cls.names()]
    if not readers:
        return f"unknown setting; {config.title} has {', '.join(sorted(config.names()))}"
    which = readers[0] if len(readers) == 1 else f"{', '.join(readers[:-1])} and {readers[-1]}"
    article = "an" if which[0] in "aeiouSE" else "a"  # an SFT, an evaluation
    return f"{name} is {article} {which} setting; {config.title} does not use it"


@functools.cache
def field_help() -> dict[str, str]:
    """Each config field's documentation — the string under it in its class's body (an attribute docstring) —
    with its lines joined: one text for a reader of this file and for the studio's run form (apps/runs/launch.py).
    Every field is declared in one class, so its name finds one text. Read from this module's source; without the
    source (byte code only) there is no help, nothing fails."""
    import sys

    try:
        tree = ast.parse(inspect.getsource(sys.modules[__name__]))
    except (OSError, TypeError, SyntaxError):
        return {}
    configs = {cls.__name__ for cls in _config_classes()}
    docs = {}
    for node in tree.body:
        if not (isinstance(node, ast.ClassDef) and node.name in configs):
            continue
        for statement, following in zip(node.body, node.body[1:], strict=False):
            if (isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name)
                    and isinstance(following, ast.Expr) and isinstance(following.value, ast.Constant)
                    and isinstance(following.value.value, str)):
                docs[statement.target.id] = " ".join(inspect.cleandoc(following.value.value).split())
    return docs


def _config_classes() -> list[type[RunConfig]]:
    """RunConfig and every class below it."""
    found, stack = [], [RunConfig]
    while stack:
        cls = stack.pop()
        if cls not in found:
            found.append(cls)
            stack.extend(cls.__subclasses__())
    return found


def config_hash(*, bundle_hash: str, config: dict) -> str:
    payload = json.dumps({"bundle": bundle_hash, "config": config}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(payload.encode()).hexdigest()


def check_recommended(settings: dict | None) -> None:
    """A bundle's `run_config`: settings a run of any kind on the bundle starts from, each kind taking those it
    has (RunConfig.own). ConfigError for a setting no kind has, or a value a kind that has it refuses."""
    settings = dict(settings or {})
    problems = {name: FieldError(name, "unknown setting") for name in settings
                if not any(name in cls.names() for cls in LAUNCHED_CONFIGS)}
    for cls in LAUNCHED_CONFIGS:
        try:
            cls.resolve(cls.own(settings))
        except ConfigError as exc:
            problems.update({(problem.field, problem.problem): problem for problem in exc.errors})
    if problems:
        raise ConfigError(list(problems.values()))


def run_config_schema() -> dict:
    """The JSON Schema of a bundle's `run_config` (the settings a run on the bundle starts from, of every kind's
    config): each field's type and default from its class, its bounds from BOUNDS and the checks, its
    documentation from field_help and the kinds that take it. The fields the studio sets are left out, as
    publishing refuses them. An editor completes and documents run_config with it; check_recommended remains the
    check."""
    from pydantic import TypeAdapter

    help_texts = field_help()
    properties, takers = {}, {}
    for cls in LAUNCHED_CONFIGS:
        for name, field_schema in TypeAdapter(cls).json_schema()["properties"].items():
            properties.setdefault(name, field_schema)
            takers.setdefault(name, []).append(cls.label)
    documented = {}
    for name, field_schema in properties.items():
        if name in SET_BY_THE_STUDIO:
            continue
        field_schema = {key: value for key, value in field_schema.items() if key != "title"}
        if name in BOUNDS:
            field_schema["minimum"], field_schema["maximum"] = BOUNDS[name]
        # What the checks say beyond BOUNDS, where JSON Schema can say it.
        field_schema.update({
            "group_size": {"minimum": 2},
            "clip_low": {"exclusiveMaximum": 1},
            "temperature": {"exclusiveMinimum": 0},
            "learning_rate": {"exclusiveMinimum": 0},
            "dpo_beta": {"exclusiveMinimum": 0},
            "dataset": {"maxLength": 1000},
            "device": {"pattern": DEVICE.pattern},
            "context_length": {"anyOf": [{"const": 0}, {"minimum": 16, "maximum": 10_000_000}]},
            "model": {"maxLength": 500},
            "domain_weights": {"additionalProperties": {"type": "number", "minimum": 0, "maximum": 1000}},
            "domain_quotas": {"additionalProperties": {"type": "number", "exclusiveMinimum": 0, "maximum": 1}},
            "category_weights": {"additionalProperties": {"type": "number", "minimum": 0, "maximum": 1000}},
            "category_quotas": {"additionalProperties": {"type": "number", "exclusiveMinimum": 0, "maximum": 1}},
        }.get(name, {}))
        taken_by = f"Taken by: {', '.join(takers[name])}."
        field_schema["description"] = f"{help_texts[name]} {taken_by}" if help_texts.get(name) else taken_by
        documented[name] = field_schema
    return {"type": "object", "additionalProperties": False, "properties": dict(sorted(documented.items())),
            "description": "Settings a run on this bundle starts from, each taken by the kinds of run that have it; "
                           "a run's own settings override them"}

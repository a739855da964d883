"""What verification takes and gives. Plain dataclasses; no Django.

A check is a function `check(spec, sample, item, context) -> Outcome`:
- `spec` is one check of a Verifier version's spec, the validated object of its class (workers/definitions/
  specs.py: StringCheck, UnitTests, ...), its defaults filled in; checks.py names the function of each type;
- `sample` is what the policy produced for one task; `item` is the task instance (inputs and hidden references);
- `context` carries the shared machinery (the sandbox pool and image, the judge client) and the deadline.
A check returns `Outcome(value=None)` when it does not apply to the sample (TRL's convention), a value in
[0, 1] otherwise, and never raises for anything the sample contains: a malformed answer is a 0 with evidence.
A fault of the grading machinery itself (a sandbox that could not start, a judge endpoint that is down) is
`status="infra_error"`: retried, and never turned into a reward.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

PASS, FAIL, PARTIAL, SKIPPED, ERROR, INFRA_ERROR = "pass", "fail", "partial", "skipped", "error", "infra_error"


@dataclass
class Sample:
    """One response of the policy to one task. `files` are what it produced besides text (e.g. solution.py,
    out.stl); `logs` are the execution logs of its tool calls, for the environment layer."""

    response: str
    files: dict[str, bytes] = field(default_factory=dict)
    logs: str = ""
    trajectory_id: str = ""  # the cache key of judge verdicts, with the judge's version


@dataclass
class Item:
    """A task instance: what the prompt is filled from (`inputs`) and what only the verifier sees (`hidden`)."""

    key: str
    inputs: dict[str, Any]
    hidden: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        return {"key": self.key, "inputs": self.inputs, "hidden": self.hidden}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Item:
        return cls(key=data["key"], inputs=data["inputs"], hidden=data["hidden"])


@dataclass
class Outcome:
    value: float | None  # None: the check does not apply to this sample
    status: str = PASS  # pass | fail | partial | skipped | error | infra_error
    evidence: str = ""  # for a person: the failing test's message, the unmatched citation, the judge's reason
    cost: float = 0.0  # money, for judge calls
    artifacts: dict[str, bytes] = field(default_factory=dict)  # rendered screenshots, logs
    # A pairwise judge's two calls: in each, its preference in [0, 1] for the answer it was shown first (the
    # graded answer first, then the reference first). Kept apart from the averaged value so that calibration can
    # measure how often the two orders agree and how much the judge favours a position.
    orders: list[float] | None = None

    @classmethod
    def scored(cls, value: float, evidence: str = "", **extra) -> Outcome:
        value = min(1.0, max(0.0, float(value)))
        status = PASS if value >= 1.0 else FAIL if value <= 0.0 else PARTIAL
        return cls(value=value, status=status, evidence=evidence, **extra)


@dataclass
class Component:
    """One check's line in a Verdict: its layer, name and weight, the value it gave, its evidence, latency and cost
    (README, *Verifiers*)."""

    layer: str
    name: str
    type: str
    weight: float
    value: float | None
    status: str
    evidence: str
    latency_ms: float
    cost: float = 0.0
    orders: list[float] | None = None  # Outcome.orders


@dataclass
class Verdict:
    reward: float | None  # None only when the verdict is an infra error: nothing to learn from
    status: str  # pass | fail | partial | infra_error
    components: list[Component] = field(default_factory=list)
    layers_run: list[str] = field(default_factory=list)
    stopped_because: str = ""
    latency_ms: float = 0.0
    cost: float = 0.0
    artifacts: dict[str, bytes] = field(default_factory=dict)

    def to_json(self) -> dict:
        """The verdict as JSON data, without its artifacts: they are bytes, and travel beside it (a trajectory
        keeps them, the archive stores them as files, a queue carries them as base64). Built field by field:
        dataclasses.asdict deep-copies, the artifacts' bytes included: on `bench trainer`'s tiny workload that was
        near half of grading 128 numeric answers (every field here is a scalar or a list of scalar rows)."""
        data = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "artifacts"}
        data["components"] = [vars(component).copy() for component in self.components]
        data["layers_run"] = list(self.layers_run)
        return data

    @classmethod
    def from_json(cls, data: dict, *, artifacts: dict[str, bytes] | None = None) -> Verdict:
        fields = {k: v for k, v in data.items() if k != "artifacts"}
        components = [Component(**c) for c in fields.pop("components", [])]
        return cls(**fields, components=components, artifacts=dict(artifacts or {}))


@dataclass
class Context:
    """The machinery checks share. Checks that need what is missing return an infra_error outcome."""

    pool: Any = None  # workers.sandbox.SandboxPool, for code that must run sandboxed
    image: Any = None  # workers.sandbox.SandboxImage of the task template
    judge: Any = None  # workers.verifiers.judge.JudgeClient
    timeout_seconds: float = 60.0

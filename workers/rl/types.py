"""What flows through the RL engine. Plain dataclasses: no Django, no torch.

A `TaskTemplate` is a pinned task-template version as the engine needs it (its prompt, tools, limits, sandbox
image and verifier spec); a `Task` is one drawn task instance of it; a `Trajectory` is one attempt at a task
by the policy: its turns (messages, token ids, logprobs, tool calls and their sandbox results), its verdict,
timings and cost. A GRPO group is the `group_size` trajectories of one task.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass, field, fields
from enum import StrEnum
from functools import cached_property
from typing import Any

from workers.definitions.specs import (
    ContextPolicy,
    FieldError,
    Limits,
    SessionSettings,
    SpecError,
    ToolSpec,
    VerifierSpec,
    parse_spec,
)
from workers.sandbox import SandboxImage
from workers.verifiers import Item, Verdict


def _parsed(kind: str, data: dict, version: str):
    """The spec of `version` as its typed object; SpecError names each field that does not validate after it."""
    try:
        return parse_spec(kind, data)
    except SpecError as exc:
        raise SpecError([FieldError(f"{version} {error.field}".strip(), error.problem) for error in exc.errors]) \
            from None


class TrajectoryStatus(StrEnum):
    OK = "ok"  # the rollout ended on its own (its reward may still be 0)
    POLICY_ERROR = "policy_error"  # the policy broke the protocol: a malformed tool call, an unknown tool
    TIMEOUT = "timeout"  # the rollout hit its time limit
    INFRA_ERROR = "infra_error"  # the machinery failed (sandbox, verifier): never scored, never trained on
    # A trainer elsewhere left the episode unfinished (its connection dropped, it idled past the server's timeout, it
    # reset before submitting: workers/environments): never scored, never trained on
    ABANDONED = "abandoned"


class Phase(StrEnum):
    """Where an unfinished trajectory is; the trainer's idle time is attributed to these."""

    ENVIRONMENT_ASSEMBLY = "environment_assembly"  # waiting for a sandbox to be ready
    GENERATION = "generation"  # waiting for or inside the inference engine
    TOOLS = "tools"  # a tool call running in the sandbox
    VERIFICATION = "verification"  # queued for or inside the verifier


@dataclass(frozen=True)
class TaskTemplate:
    """A pinned task-template version, its specs parsed once, where it is built (`from_spec`, `from_json`): every
    reader takes the typed value, and every rollout thread shares the same immutable objects."""

    key: str  # the exact version, "task_template/add-two@1"
    domain: str
    system_prompt: str
    prompt_template: str
    tools: tuple[ToolSpec, ...]
    limits: Limits  # per trajectory (max_turns, max_tokens, max_seconds, max_tool_calls) and per turn (max_turn_*)
    image: SandboxImage
    verifier_key: str  # "verifier/numeric-exact@1"
    verifier_spec: VerifierSpec
    examples: tuple[dict, ...] = ()  # earlier turns the model sees before each prompt (few-shot), {role, content}
    session: SessionSettings | None = None  # one sandbox held for the trajectory (rollout/sessions.py); None: none
    # What happens when the conversation outgrows the model (a spec without one: the rollout ends).
    context: ContextPolicy = field(default_factory=ContextPolicy)

    @classmethod
    def from_spec(cls, *, key: str, domain: str, spec: dict, image: SandboxImage, verifier_key: str,
                  verifier_spec: dict) -> TaskTemplate:
        """From a task template version's spec and its verifier version's spec; SpecError names every field of
        either that does not validate, after the version it belongs to."""
        template = _parsed("task_template", spec, key)
        return cls(key=key, domain=domain, system_prompt=template.system_prompt,
                   prompt_template=template.prompt_template, tools=tuple(template.tools), limits=template.limits,
                   image=image, verifier_key=verifier_key,
                   verifier_spec=_parsed("verifier", verifier_spec, verifier_key),
                   examples=tuple(message.model_dump() for message in template.examples), session=template.session,
                   context=template.context or ContextPolicy())

    @cached_property
    def tool_schemas(self) -> tuple[dict, ...]:
        """The tools as the function schemas a chat template and an OpenAI endpoint take (ToolSpec.function)."""
        return tuple(tool.function() for tool in self.tools)

    def to_json(self) -> dict:
        return {"key": self.key, "domain": self.domain, "system_prompt": self.system_prompt,
                "prompt_template": self.prompt_template, "tools": [tool.model_dump() for tool in self.tools],
                "limits": self.limits.model_dump(), "image": self.image.to_json(), "verifier_key": self.verifier_key,
                "verifier_spec": self.verifier_spec.model_dump(mode="json"), "examples": list(self.examples),
                "session": self.session.model_dump() if self.session else None, "context": self.context.model_dump()}

    @classmethod
    def from_json(cls, data: dict) -> TaskTemplate:
        return cls(key=data["key"], domain=data["domain"], system_prompt=data["system_prompt"],
                   prompt_template=data["prompt_template"],
                   tools=tuple(ToolSpec.model_validate(tool) for tool in data["tools"]),
                   limits=Limits.model_validate(data["limits"]), image=SandboxImage.from_json(data["image"]),
                   verifier_key=data["verifier_key"], verifier_spec=VerifierSpec.model_validate(data["verifier_spec"]),
                   examples=tuple(data["examples"]),
                   session=SessionSettings.model_validate(data["session"]) if data["session"] else None,
                   context=ContextPolicy.model_validate(data["context"]))

    def messages(self, item: Item, *, examples: bool = True) -> list[dict]:
        """The conversation the model is prompted with. Without `examples`, what a trajectory records as its
        opening turns: the examples are context the model read, not turns of this rollout — a final answer or a
        tool result must never be taken from them."""
        messages = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        if examples:
            messages += [{"role": m["role"], "content": m["content"]} for m in self.examples]
        return messages + [{"role": "user", "content": self.prompt_template.format(**item.inputs)}]


@dataclass(frozen=True)
class Task:
    """One drawn task. `seq` numbers the draws of a run; a trajectory's id derives from (run, seq, sample)."""

    seq: int
    template: TaskTemplate
    item: Item
    item_hash: str = ""

    @property
    def domain(self) -> str:
        return self.template.domain


def trajectory_id(run_id: str, seq: int, sample: int) -> str:
    """Deterministic: a resumed run that replays draw `seq` writes the same rows again, not new ones."""
    return str(uuid.uuid5(uuid.UUID(run_id), f"{seq}/{sample}"))


# A tool call as the policy writes it in its text: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` (the
# Hermes / Qwen convention most open chat templates use). The tools parse it (rollout/tools.py), and an engine
# behind a chat API turns it into the API's tool_calls (engines/endpoint.py).
TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


@dataclass
class ToolCall:
    id: str
    name: str
    arguments: dict


@dataclass
class ToolResult:
    """What a tool call gave back (protocols.ToolRunner): the text the policy reads, and the sandbox's account of
    the run that a trajectory records."""

    status: str  # the sandbox's Status, or infra_error
    text: str  # what the policy reads
    exit_code: int | None = None
    stdout: str = ""
    stderr: str = ""
    wall_seconds: float = 0.0
    cpu_seconds: float = 0.0
    assembly_seconds: float = 0.0  # waiting for a sandbox
    attempts: int = 1
    reason: str = ""
    files: list[str] = field(default_factory=list)
    # A repository task's workspace, after this call: its diff against the base (swe_tools.SweToolSet).
    workspace_diff: str | None = None
    # The context policy cut this output in what the model read afterwards (rollout/agent.py: fit_context); the
    # tool turn's content stays whole for review.
    context_text_cut: bool = False

    def to_json(self) -> dict:
        """Without the text (a tool turn's content holds it); the fields added later only where they are set."""
        data = {"status": self.status, "exit_code": self.exit_code, "stdout": self.stdout, "stderr": self.stderr,
                "wall_seconds": round(self.wall_seconds, 4), "cpu_seconds": round(self.cpu_seconds, 4),
                "assembly_seconds": round(self.assembly_seconds, 4), "attempts": self.attempts,
                "reason": self.reason, "files": list(self.files)}
        if self.workspace_diff is not None:
            data["workspace_diff"] = self.workspace_diff
        if self.context_text_cut:
            data["context_text_cut"] = True
        return data

    @classmethod
    def from_json(cls, data: dict, *, text: str) -> ToolResult:
        return cls(text=text, **data)


@dataclass
class Turn:
    """One message of the conversation. Assistant turns carry the sampled token ids, their logprobs and the policy
    version that sampled each; user and tool turns carry the token ids they added to the context (masked out of
    the loss)."""

    role: str  # system | user | assistant | tool
    content: str
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    tool_calls: list[ToolCall] = field(default_factory=list)
    tool_call_id: str = ""
    name: str = ""  # the tool, on a tool turn
    result: ToolResult | None = None  # a tool turn's: what the sandbox gave back (its text is the content)
    finish_reason: str = ""  # assistant: stop | length | tool_calls | context
    started_s: float = 0.0  # seconds since the trajectory started (the replay's timeline)
    duration_s: float = 0.0
    # The context policy rewrote the conversation after this assistant turn was sampled (older tool outputs
    # dropped or cut): its tokens were sampled from a context the training sequence no longer holds, so they are
    # context now (loss mask 0), never trained on. A tool turn's token_ids are then what the model read afterwards.
    masked: bool = False
    # An assistant turn's: the policy version whose weights sampled each token (new weights may arrive between two
    # tokens: engines/__init__.py). Empty in turns stored before versions were kept, and from engines that do not
    # say: each token then counts as sampled by its trajectory's policy_version, the oldest that wrote any of it.
    versions: list[int] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """The turn as trajectories store it (Trajectory.to_json, the archive's rows): `result` {} off a tool turn;
        `versions` only on a turn that has them, as runs [[version, tokens], ...]: a turn's tokens change version
        at most once per update during it, and a long trajectory's archive row should not grow by a number per
        token for them."""
        data = {"role": self.role, "content": self.content, "token_ids": list(self.token_ids),
                "logprobs": list(self.logprobs), "tool_calls": [vars(call).copy() for call in self.tool_calls],
                "tool_call_id": self.tool_call_id, "name": self.name,
                "result": self.result.to_json() if self.result is not None else {},
                "finish_reason": self.finish_reason, "started_s": self.started_s, "duration_s": self.duration_s,
                "masked": self.masked}
        if self.versions:
            runs: list[list[int]] = []
            for version in self.versions:
                if runs and runs[-1][0] == version:
                    runs[-1][1] += 1
                else:
                    runs.append([version, 1])
            data["versions"] = runs
        return data

    @classmethod
    def from_json(cls, data: dict) -> Turn:
        result = data.get("result")
        return cls(**{**data, "tool_calls": [ToolCall(**call) for call in data.get("tool_calls", [])],
                      "result": ToolResult.from_json(result, text=data["content"]) if result else None,
                      "versions": [version for version, count in data.get("versions", []) for _ in range(count)]})


@dataclass
class Trajectory:
    id: str
    run_id: str
    seq: int
    sample: int
    domain: str
    template: str
    task_key: str
    task_hash: str
    image: str
    verifier: str
    policy_version: int
    prompt_ids: list[int] = field(default_factory=list)  # what the policy saw before its first turn
    turns: list[Turn] = field(default_factory=list)
    status: TrajectoryStatus = TrajectoryStatus.OK
    status_reason: str = ""
    reward: float | None = None
    verdict: Verdict | None = None  # None until graded (and for an infra error); its artifacts are held below
    artifacts: dict[str, bytes] = field(default_factory=dict)  # rendered screenshots, logs
    timings: dict[str, float] = field(default_factory=dict)  # seconds per Phase, plus queue and total
    costs: dict[str, float] = field(default_factory=dict)  # policy_seconds, sandbox_cpu_seconds, judge, total
    tool_retries: int = 0
    # The limit that ended it, if one did: turns | tokens | seconds | tool_calls | context | session_calls |
    # session_lifetime; or that cut one of its turns short (turn_tokens, turn_calls, turn_seconds) when nothing ended
    # it sooner. The run page shows the share of trajectories that hit each.
    limit_hit: str = ""
    restarts: int = 0  # times it started over after an infrastructure failure (its session's host lost, say)
    started_at: float = 0.0  # wall clock (time.time())
    finished_at: float = 0.0
    # Set by the trainer: the step that consumed it (trained on it, or dropped it: no signal, too stale, infra
    # error), its advantage, and whether its group carried signal (reward variance) and was trained on.
    step: int | None = None
    advantage: float | None = None
    effective: bool | None = None

    @property
    def completion_tokens(self) -> int:
        return sum(len(t.token_ids) for t in self.turns if t.role == "assistant")

    @property
    def workspace_diff(self) -> str | None:
        """A repository task's final diff against its base: the one recorded after its last tool call (None when
        no tool call recorded one: not a repository task)."""
        for turn in reversed(self.turns):
            if turn.result is not None and turn.result.workspace_diff is not None:
                return turn.result.workspace_diff
        return None

    @property
    def response(self) -> str:
        """The final answer: the last assistant message."""
        return next((t.content for t in reversed(self.turns) if t.role == "assistant"), "")

    def token_versions(self, turn: Turn) -> list[int]:
        """The policy version that sampled each of an assistant turn's tokens (its trajectory's oldest where the
        turn does not say)."""
        if len(turn.versions) == len(turn.token_ids):
            return turn.versions
        return [self.policy_version] * len(turn.token_ids)

    def trained_versions(self) -> list[int]:
        """The policy versions that sampled the tokens the loss may train on (the unmasked assistant turns'),
        before any staleness bound."""
        return [v for turn in self.turns if turn.role == "assistant" and not turn.masked
                for v in self.token_versions(turn)]

    def training_sequence(self, oldest_version: int | None = None) -> tuple[list[int], list[int], list[float]]:
        """(token ids, loss mask, sampling logprobs) over the whole context: the prompt and tool results are
        context (mask 0), the policy's own tokens are trained on (mask 1) unless sampled by weights older than
        `oldest_version` (partial rollouts: the per-token staleness bound, training/trainer.py)."""
        ids, mask, logprobs = list(self.prompt_ids), [0] * len(self.prompt_ids), [0.0] * len(self.prompt_ids)
        for turn in self.turns:
            if turn.role == "assistant":
                ids += turn.token_ids
                if turn.masked:
                    mask += [0] * len(turn.token_ids)
                elif oldest_version is None:
                    mask += [1] * len(turn.token_ids)
                else:
                    mask += [int(v >= oldest_version) for v in self.token_versions(turn)]
                logprobs += turn.logprobs
            elif turn.token_ids:
                ids += turn.token_ids
                mask += [0] * len(turn.token_ids)
                logprobs += [0.0] * len(turn.token_ids)
        # Context after the policy's last token (a final tool result) teaches nothing and may not fit the model.
        end = max((i + 1 for i, m in enumerate(mask) if m), default=len(ids))
        return ids[:end], mask[:end], logprobs[:end]

    def to_json(self) -> dict[str, Any]:
        """Without the artifacts (bytes: the archive stores them as files, a queue as base64); a verdict not yet
        given is {}. The stored format: archived rows and checkpoints written before the verdict and the tool
        results were typed read back the same (tests/workers/test_wire.py)."""
        data = {name: getattr(self, name) for name in STORED_FIELDS}
        data.update(prompt_ids=list(self.prompt_ids), turns=[turn.to_json() for turn in self.turns],
                    status=str(self.status), verdict=self.verdict.to_json() if self.verdict is not None else {},
                    timings=dict(self.timings), costs=dict(self.costs))
        return data

    @classmethod
    def from_json(cls, data: dict) -> Trajectory:
        return cls(**{**data, "turns": [Turn.from_json(turn) for turn in data.get("turns", [])],
                      "status": TrajectoryStatus(data.get("status", "ok")),
                      "verdict": Verdict.from_json(data["verdict"]) if data.get("verdict") else None})


STORED_FIELDS = tuple(f.name for f in fields(Trajectory) if f.name != "artifacts")  # Trajectory.to_json's keys

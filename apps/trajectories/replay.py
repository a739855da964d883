"""One trajectory, built once for the replay page: its turns in order (each a step of the replay), the model's
tokens with their logprobs, tool calls beside the sandbox's answers, the verdict by layer, and a timeline.

Views and templates read a TrajectoryInfo and never dig through the JSON columns themselves.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from functools import lru_cache

from django.urls import reverse

from apps.common import figures, wiring
from workers.rl.models.chat_formats import END_OF_TURN, CharTokenizer
from workers.rl.rollout.feedback import repair
from workers.rl.types import Turn

from .models import Trajectory

MAX_TOKENS_SHOWN = 4000  # per turn; past this the text is shown plain
OPEN_OUTPUT_LINES = 12  # a tool's output longer than this starts collapsed
REPAIR_OUTPUT_LINES = 20  # a test run's last lines in the repair chain (its turn holds the whole output)


@dataclass
class Token:
    text: str
    logprob: float | None

    @property
    def probability(self) -> float | None:
        return None if self.logprob is None else math.exp(self.logprob)


@dataclass
class Step:
    index: int
    role: str
    content: str
    title: str
    tokens: list[Token] = field(default_factory=list)
    tool_calls: list[dict] = field(default_factory=list)
    result: dict = field(default_factory=dict)
    finish_reason: str = ""
    started_s: float = 0.0
    duration_s: float = 0.0
    artifacts: list[dict] = field(default_factory=list)
    tokens_note: str = ""
    # A tool step: the call that ran (bash's command, the editor's command and path), its output's size, and for a
    # repository task the workspace's diff after it (None where the step left the workspace as it was).
    command: str = ""
    output_lines: int = 0
    diff: str | None = None
    diff_lines: int = 0
    workspace: bool = False  # the trajectory records its workspace's diff (a repository task)

    @property
    def collapsed(self) -> bool:
        return self.output_lines > OPEN_OUTPUT_LINES


@dataclass
class Layer:
    name: str
    components: list[dict]


@dataclass
class RepairStep:
    """A test run or an edit of a repair trajectory (workers/rl/rollout/feedback.py), as the replay's chain shows
    it: a test run's output (its last lines: pytest's failures and summary end it), an edit's diff after it."""

    turn: int
    kind: str  # test | edit
    tool: str
    passed: bool | None
    text: str
    in_chain: bool  # one of the fix's three: the failing run, the edit that answered it, the passing run after


@dataclass
class RepairInfo:
    outcome: str | None  # feedback.OUTCOMES, None while ungraded
    steps: list[RepairStep]
    chain: list[int]  # the fix chain's turns, [] without one

    @property
    def outcome_label(self) -> str:
        return (self.outcome or "").replace("_", " ")


def repair_info(row: Trajectory) -> RepairInfo | None:
    """The trajectory's test runs and edits, read from its tool results as the metric reads them; None when it has
    neither (not a repair trajectory)."""
    found = repair([Turn.from_json(turn) for turn in row.turns or []], row.reward)
    if not found.events:
        return None
    return RepairInfo(found.outcome, [
        RepairStep(turn=event.turn, kind=event.kind, tool=event.tool, passed=event.passed,
                   text=_last_lines(event.output, REPAIR_OUTPUT_LINES) if event.kind == "test" else event.diff,
                   in_chain=found.chain is not None and event in found.chain)
        for event in found.events], [event.turn for event in found.chain or ()])


def _last_lines(text: str, count: int) -> str:
    return "\n".join(text.rstrip("\n").split("\n")[-count:])


@dataclass
class TrajectoryInfo:
    row: Trajectory
    steps: list[Step]
    layers: list[Layer]
    artifacts: list[dict]
    timeline_json: str
    mean_logprob: float | None
    final_diff: str | None = None  # a repository task's diff against its base, as verification replayed it
    # Played by a trainer elsewhere (a run of kind external): {"client", "model"} as the trainer named them; its
    # model's turns are text as the client reported them, the tool results and the verdict the studio's own.
    trained_elsewhere: dict | None = None
    repair: RepairInfo | None = None  # a trajectory that ran tests or edited code: its repair steps as a chain
    # Its tokens by the policy version that sampled them, where it records them (partial rollouts: new weights
    # reached it mid-rollout), [(version, tokens)] oldest first; empty when one version wrote it all.
    tokens_by_version: list[tuple[int, int]] = field(default_factory=list)


def tokens_by_version(turns: list[dict]) -> list[tuple[int, int]]:
    """An archived trajectory's sampled tokens counted by version, from its turns' runs [[version, tokens], ...]
    (workers/rl/types.py Turn.to_json); empty unless two or more versions wrote it."""
    counts: dict[int, int] = {}
    for turn in turns:
        for version, tokens in turn.get("versions", []) if turn.get("role") == "assistant" else []:
            counts[version] = counts.get(version, 0) + tokens
    return sorted(counts.items()) if len(counts) > 1 else []


def _pieces(model: str, ids: list[int]) -> tuple[list[str] | None, str]:
    """The text of each sampled token, from the run's own tokenizer: the demo model's character tokenizer (a
    character each, and its format markers such as ```python whole), or a Hugging Face model's on this
    machine; without one only the text is shown."""
    if not ids:
        return None, ""
    if model == "builtin:demo-tiny":
        tokenizer = _char_tokenizer()
        end = tokenizer.id_of(END_OF_TURN)
        return ["⏎" if i == end else tokenizer.decode([i]) for i in ids], ""
    directory = wiring.model_directory(model)
    tokenizer = _tokenizer(str(directory)) if directory is not None else None
    if tokenizer is None:
        return None, f"{len(ids)} tokens; per-token colours need the run's tokenizer ({model or 'unknown'})"
    return [tokenizer.convert_tokens_to_string([t]) for t in tokenizer.convert_ids_to_tokens(ids)], ""


@lru_cache(maxsize=1)
def _char_tokenizer():
    return CharTokenizer()


@lru_cache(maxsize=4)
def _tokenizer(path: str):
    try:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(path, local_files_only=True)
    except Exception:  # a path that is not a tokenizer: show text only
        return None


def artifact_url(row: Trajectory, name: str) -> str:
    return reverse("trajectories:artifact", kwargs={"project": row.project.slug, "trajectory_id": row.pk,
                                                    "name": name})


def _author(row: Trajectory) -> str:
    """Who wrote the assistant turns: the policy, or, in a reference check, the tasks' references."""
    return "reference" if row.run.is_reference_check else "model"


def trajectory_info(row: Trajectory) -> TrajectoryInfo:
    model = (row.run.config or {}).get("model", "") if row.run_id else ""
    artifacts = [{**a, "url": artifact_url(row, a["name"]), "image": a.get("content_type", "").startswith("image/")}
                 for a in row.artifacts or []]
    steps = []
    calls_by_id = {call.get("id"): call for turn in row.turns or [] for call in turn.get("tool_calls", [])}
    workspace = any("workspace_diff" in turn.get("result", {}) for turn in row.turns or [])
    for index, turn in enumerate(row.turns or []):
        role = turn.get("role", "")
        step = Step(index=index, role=role, content=turn.get("content", ""), title=role,
                    finish_reason=turn.get("finish_reason", ""), started_s=turn.get("started_s", 0.0),
                    duration_s=turn.get("duration_s", 0.0))
        if role == "assistant":
            ids, logprobs = turn.get("token_ids", []), turn.get("logprobs", [])
            pieces, step.tokens_note = _pieces(model, ids)
            if pieces and len(pieces) <= MAX_TOKENS_SHOWN:
                step.tokens = [Token(p, logprobs[i] if i < len(logprobs) else None) for i, p in enumerate(pieces)]
            step.tool_calls = [{**call, "code": call.get("arguments", {}).get("code"),
                                "arguments_json": json.dumps(call.get("arguments", {}), indent=2)}
                               for call in turn.get("tool_calls", [])]
            calls = ", ".join(c["name"] for c in step.tool_calls)
            step.title = _author(row) + (f" → {calls}" if step.tool_calls else "")
        elif role == "tool":
            step.result = turn.get("result", {})
            step.title = f"tool {turn.get('name', '')}".strip()
            step.command = call_summary(calls_by_id.get(turn.get("tool_call_id", "")))
            shown = step.result.get("stdout", "") + step.result.get("stderr", "") or step.content
            step.output_lines = shown.count("\n") + 1 if shown else 0
            step.workspace = workspace
            step.diff = step.result.get("workspace_diff")
            step.diff_lines = step.diff.count("\n") if step.diff else 0
            files = set(step.result.get("files", []))
            step.artifacts = [a for a in artifacts if a["name"] in files or a["name"].rsplit("/", 1)[-1] in files]
        steps.append(step)
    layers: dict[str, Layer] = {}
    for component in (row.verdict or {}).get("components", []):
        layer = component.get("layer", "")
        layers.setdefault(layer, Layer(layer, [])).components.append(component)
    assistant_logprobs = [lp for t in row.turns or [] if t.get("role") == "assistant" for lp in t.get("logprobs", [])]
    final_diff = next((step.diff for step in reversed(steps) if step.diff is not None), None)
    return TrajectoryInfo(row=row, steps=steps, layers=list(layers.values()), artifacts=artifacts,
                          timeline_json=figures.to_json(figures.timeline_figure(timeline_rows(row))),
                          mean_logprob=sum(assistant_logprobs) / len(assistant_logprobs) if assistant_logprobs
                          else None, final_diff=final_diff, trained_elsewhere=_trained_elsewhere(row),
                          repair=repair_info(row), tokens_by_version=tokens_by_version(row.turns or []))


def _trained_elsewhere(row: Trajectory) -> dict | None:
    if not (row.run_id and row.run.is_external):
        return None
    config = row.run.config or {}
    return {"client": config.get("client", ""), "model": config.get("trainer_model", "")}


def call_summary(call: dict | None) -> str:
    """What a tool call did, in a line: bash's command, the editor's command and path (with its range)."""
    if not call:
        return ""
    arguments = call.get("arguments") or {}
    if call.get("name") == "bash":
        return str(arguments.get("command", ""))
    if call.get("name") == "str_replace_editor":
        view_range = arguments.get("view_range")
        return " ".join(str(part) for part in (arguments.get("command", ""), arguments.get("path", ""),
                                               view_range if view_range else "") if part)
    return call.get("name", "")


def timeline_rows(row: Trajectory) -> list[dict]:
    """Each model turn and tool call where it happened, then verification after the last turn."""
    rows, end = [], 0.0
    for index, turn in enumerate(row.turns or []):
        role = turn.get("role")
        if role not in ("assistant", "tool"):
            continue
        start, duration = turn.get("started_s", 0.0), turn.get("duration_s", 0.0)
        end = max(end, start + duration)
        label = f"{index}: {_author(row)}" if role == "assistant" else f"{index}: {turn.get('name') or 'tool'}"
        rows.append({"label": label, "start": start, "duration": duration,
                     "kind": "generation" if role == "assistant" else "tool"})
    timings = row.timings or {}
    if timings.get("verification"):
        rows.append({"label": "verification", "start": end, "duration": timings["verification"],
                     "kind": "verification"})
    return rows

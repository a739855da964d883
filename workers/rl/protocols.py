"""The engine's seams: what the pipeline, its parts and the composition root (apps/common/wiring.py) call on the
things a run is given — an inference engine, the policy it trains, the chat format that turns messages into
tokens, the runner of its tool calls, the verifier of its answers, and the tracker it reports to — and `Model`,
the policy, engine and chat format a run trains and samples with.

Each lists only what the code calls through the seam. The implementations:
- Engine: engines/ (BatchingEngine's TorchEngine, TransformersEngine and VLLMEngine; ServerEngine,
  EndpointEngine, RanksEngine).
- Policy: models/policies.py (TinyLMPolicy, HFPolicy).
- ChatFormat: models/chat_formats.py (CharChat, HFChat); engines/endpoint.py (MessagesChat).
- ToolRunner: rollout/tools.py (SandboxToolRunner, this process); workers/remote.py (RemoteToolRunner).
- ToolSession: rollout/sessions.py (LocalToolSession); workers/remote.py (RemoteToolSession).
- Verifier: rollout/grading.py (LocalVerifier, this process); workers/remote.py (RemoteVerifier).
- Tracker: training/tracking.py (MemoryTracker); apps/runs/attempts/tracker.py (the studio's, its database).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from workers.sandbox import SandboxImage
from workers.verifiers import Item, Verdict

from .engines import Completion, GenerationRequest
from .types import TaskTemplate, ToolResult, Trajectory

if TYPE_CHECKING:
    import torch


class LeaseLost(Exception):
    """Another worker took the run over: stop writing at once."""


class AttemptAbandoned(Exception):
    """The attempt stops where it is, without a verdict: it made no progress for too long (training/tracking.py's
    Heartbeat). The run is left running; its heartbeat goes stale, and the watchdog (or the next embedded studio)
    resumes it from its newest checkpoint on whichever worker claims it. (A process asked to stop is not abandoned:
    its training loop ends the run interrupted at the last step it finished, training/loop.py.)"""


class Engine(Protocol):
    """Samples completions from the policy's weights; the pipeline hands it new weights after each step."""

    name: str  # torch | transformers | vllm | server | endpoint | ranks: which ones data-parallel ranks can copy
    policy_version: int  # the weights it samples with now (the trainer step they come from)
    max_context: int | None  # the longest context the model takes (prompt + completion), if bounded
    shares_weights: bool  # samples from the trainer's own model: an update needs no copy, only a new version

    def generate(self, requests: list[GenerationRequest]) -> list[list[Completion]]:
        """One list of `request.n` completions per request."""

    def load_weights(self, state: dict | None, version: int) -> None:
        """The trainer's weights (None for an engine that shares them), sampled with from the next batch on."""

    def close(self) -> None: ...


class Policy(Protocol):
    """The trainer's view of a model: logprobs over padded batches, its trainable state, the weights it hands
    the engine."""

    device: str

    def trainable_parameters(self) -> list[torch.nn.Parameter]: ...

    def train(self) -> None: ...

    def logprobs(self, ids: torch.Tensor, attention_mask: torch.Tensor, temperature: float,
                 first: int = 0, with_entropy: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        """ids (B, T) right-padded -> logprobs and entropy of ids[:, first + 1:], with gradients (the entropy
        zeros, not computed, `with_entropy` False)."""

    def frozen_copy(self):
        """The KL reference: an object whose `logprobs(ids, attention_mask, temperature, first)` returns the
        logprobs alone, without gradients."""

    def inference_state(self) -> dict:
        """The weights the engine loads, under the names of the model it serves."""

    def save(self, path: Path) -> None:
        """The trainable state (LoRA: the adapters) as one safetensors file: a checkpoint's model.safetensors."""

    def restore(self, path: Path) -> None: ...


class ChatFormat(Protocol):
    """From messages to the token ids a policy sees, and back."""

    stop_ids: tuple[int, ...]

    def prompt(self, messages: list[dict], tools: list[dict]) -> list[int]:
        """The ids of the conversation so far, ending where the assistant's first turn begins."""

    def continuation(self, messages: list[dict], new: list[dict], tools: list[dict]) -> list[int]:
        """The ids that `new` (tool results) append after `messages`, ending where the next assistant turn
        begins. `messages` ends with the assistant turn whose sampled ids are already in the context."""

    def decode(self, ids: list[int]) -> str:
        """Text of sampled ids, without the stop token."""


class TrainingChat(ChatFormat, Protocol):
    """A chat format a model is trained through on whole conversations (SFT, DPO): the studio's own models'
    formats, not an endpoint's."""

    def training_tokens(self, messages: list[dict], tools: list[dict],
                        trained_from: int = 0) -> tuple[list[int], list[int]]:
        """(ids, mask) of a whole conversation for SFT and DPO, the mask 1 on the tokens of the assistant's
        messages from index `trained_from` on (their text and end of turn), 0 on the prompts and tool results."""


class ToolRunner(Protocol):
    def run(self, image: SandboxImage, name: str, arguments: dict, *,
            on_acquired: Callable[[], None] | None = None) -> ToolResult:
        """One tool call in a fresh sandbox of `image`; `on_acquired` is called once the sandbox is ready.
        PolicyToolError (rollout/tools.py) for a call that is the policy's mistake."""


class ToolSession(Protocol):
    """One trajectory's sandbox session (a template that declares `session:`), as the rollout sees it: in this
    process (rollout/sessions.py's LocalToolSession, opened from a SandboxToolRunner's pool) or on another worker
    (workers/remote.py's RemoteToolSession, opened by RemoteToolRunner.open_session)."""

    id: str
    host: str  # "local", or the worker that holds the sandbox

    def run(self, name: str, arguments: dict) -> ToolResult:
        """One tool call in the session. PolicyToolError for a malformed call; status infra_error when the session
        is lost, `limit` when its budget is spent."""

    def close(self) -> None:
        """Gives the sandbox back; safe to call twice, never raises."""


class Verifier(Protocol):
    def verify(self, template: TaskTemplate, trajectory: Trajectory, item: Item) -> Verdict:
        """The layered verifier's verdict on a finished rollout (its reward None when it could not grade)."""


class Tracker(Protocol):
    """Where the pipeline reports: each step's points, trajectories and events, the checkpoints, the heartbeats."""

    attempt: int  # the run's attempt this worker holds: it fences the checkpoints it writes (training/checkpoint)

    def step(self, *, step: int, wall_time: float, points: dict, trajectories: list[Trajectory],
             events: list[tuple[str, str, dict]]) -> None: ...

    def checkpoint(self, *, step: int, path: str, size: int, removed: list[int]) -> None: ...

    def event(self, kind: str, message: str, *, step: int | None = None, details: dict | None = None) -> None: ...

    def heartbeat(self) -> str:
        """What the run's owner asked for meanwhile: "", "pause" or "cancel"; raises LeaseLost."""

    def rollback(self, step: int) -> None:
        """Forget what an earlier attempt wrote after `step`."""


@dataclass
class Model:
    """What a run trains and samples with: the policy (its weights and trainable parameters), the inference
    engine that samples from it, and the chat format that turns messages into tokens (models/build.py makes one
    from a run's config)."""

    policy: Policy
    engine: Engine | None  # None: a run that samples nothing (SFT, DPO)
    chat: ChatFormat

    def close(self) -> None:
        if self.engine is not None:
            self.engine.close()

"""Inference engines behind one interface: generate groups of samples with their logprobs; load new weights.

- `torch`: the project's own TinyLM with a KV cache, on the CPU or a GPU (torch_engine.py).
- `transformers`: any Hugging Face causal LM loaded from a local path (hf.py).
- `vllm`: for GPU workers (vllm_engine.py); vLLM is imported only when this engine is built, and runs in the
  GPU worker's own environment (requirements/gpu.txt), since it pins its own torch and transformers.

Each engine serialises its own calls (one model, many rollout threads) and counts the seconds it spent
generating, which the pipeline turns into policy compute cost.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class GenerationRequest:
    prompt_ids: list[int]
    n: int  # samples of this prompt
    max_new_tokens: int
    stop_ids: tuple[int, ...]
    temperature: float = 1.0
    seed: int | None = None  # fixes the sampling of this request, whatever else runs concurrently


@dataclass
class Completion:
    token_ids: list[int]  # the sampled ids, the stop id included when the model stopped
    logprobs: list[float]  # of each sampled id under the sampling distribution (temperature applied)
    finish_reason: str  # stop | length
    compute_seconds: float = 0.0  # this completion's share of the engine's busy time (its policy cost)
    policy_version: int = 0  # the weights that sampled it


class InferenceEngine(Protocol):
    name: str
    policy_version: int
    max_context: int | None  # the longest context the model takes (prompt + completion), if bounded
    busy_seconds: float

    def generate(self, requests: list[GenerationRequest]) -> list[list[Completion]]:
        """One list of `request.n` completions per request."""

    def load_weights(self, state: dict, version: int) -> None:
        """The trainer's new weights (names as in the trainer's model), without a restart."""

    def close(self) -> None:
        ...


def trim(tokens: list[int], logprobs: list[float], stop_ids: tuple[int, ...], max_new_tokens: int) -> Completion:
    """A completion cut right after its first stop id."""
    for index, token in enumerate(tokens):
        if token in stop_ids:
            return Completion(tokens[:index + 1], logprobs[:index + 1], "stop")
    return Completion(tokens, logprobs, "length")


def stamp(groups: list[list[Completion]], *, seconds: float, policy_version: int) -> list[list[Completion]]:
    """Each completion's share of `seconds` of engine time, by the tokens it sampled (its policy cost), and the
    version of the weights that sampled it."""
    total = max(1, sum(len(c.token_ids) for group in groups for c in group))
    for group in groups:
        for completion in group:
            completion.compute_seconds = seconds * len(completion.token_ids) / total
            completion.policy_version = policy_version
    return groups

"""The `torch` engine: the project's TinyLM sampling with its KV cache, on the CPU or a GPU."""

from __future__ import annotations

import copy

import torch

from ..model import TinyLM
from . import BatchingEngine, Completion, GenerationRequest, trim
from .sampling import SamplingRequest, sample_batch


class TorchEngine(BatchingEngine):
    name = "torch"

    def __init__(self, model: TinyLM, *, device: str = "cpu", policy_version: int = 0, max_batch_rows: int = 512):
        # Its own copy: the trainer updates its model while rollouts sample from this one.
        self.model = copy.deepcopy(model).to(device).eval()
        self.device = device
        self.max_context = model.config.block_size
        super().__init__(policy_version=policy_version, max_batch_rows=max_batch_rows)

    def _sample(self, requests: list[GenerationRequest]) -> list[list[Completion]]:
        batch = [SamplingRequest(r.prompt_ids, r.n, r.max_new_tokens, tuple(r.stop_ids), r.temperature,
                                 None if r.seed is None else torch.Generator(device=self.device).manual_seed(r.seed))
                 for r in requests]
        sampled = sample_batch(self.model.sampling_step, batch, context=self.max_context, device=self.device)
        return [[trim(tokens, logprobs, r.stop_ids, r.max_new_tokens) for tokens, logprobs in rows]
                for r, rows in zip(requests, sampled, strict=True)]

    def _load(self, state: dict) -> None:
        self.model.load_state_dict(state)

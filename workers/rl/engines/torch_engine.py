"""The `torch` engine: the project's TinyLM sampling with its KV cache, on the CPU or a GPU."""

from __future__ import annotations

import copy
import threading
import time

import torch

from ..model import TinyLM
from . import Completion, GenerationRequest, trim


class TorchEngine:
    name = "torch"

    def __init__(self, model: TinyLM, *, device: str = "cpu", policy_version: int = 0):
        # Its own copy: the trainer updates its model while rollouts sample from this one.
        self.model = copy.deepcopy(model).to(device).eval()
        self.device = device
        self.policy_version = policy_version
        self.max_context = model.config.block_size
        self.busy_seconds = 0.0
        self._lock = threading.Lock()

    def generate(self, requests: list[GenerationRequest]) -> list[list[Completion]]:
        with self._lock:
            started = time.monotonic()
            try:
                return [self._one(request) for request in requests]
            finally:
                self.busy_seconds += time.monotonic() - started

    def _one(self, request: GenerationRequest) -> list[Completion]:
        room = self.max_context - len(request.prompt_ids)
        if room < 1:
            raise ValueError(f"prompt of {len(request.prompt_ids)} tokens leaves no room in a context of "
                             f"{self.max_context}")
        generator = None
        if request.seed is not None:
            generator = torch.Generator(device=self.device).manual_seed(request.seed)
        tokens, logprobs = self.model.generate(request.prompt_ids, samples=request.n,
                                               max_new_tokens=min(request.max_new_tokens, room),
                                               stop=request.stop_ids, temperature=request.temperature,
                                               generator=generator)
        return [trim(row.tolist(), lps.tolist(), request.stop_ids, request.max_new_tokens)
                for row, lps in zip(tokens.cpu(), logprobs.cpu(), strict=True)]

    def load_weights(self, state: dict, version: int) -> None:
        with self._lock:
            self.model.load_state_dict(state)
            self.policy_version = version

    def close(self) -> None:
        pass

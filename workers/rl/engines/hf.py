"""The `transformers` engine: any Hugging Face causal LM from a local path, sampling with its KV cache.

The sampling loop is ours rather than `model.generate`: a model's generation_config often carries top_k,
top_p or a repetition penalty, and the logprobs GRPO needs must be those of the distribution the tokens were
really drawn from — softmax(logits / temperature), exactly what the trainer recomputes (policy.token_logprobs).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import torch
from torch.nn import functional as F

from . import Completion, GenerationRequest, stamp, trim


class TransformersEngine:
    name = "transformers"

    def __init__(self, path: str, *, device: str = "cpu", policy_version: int = 0, dtype=torch.float32):
        from transformers import AutoModelForCausalLM

        if not Path(path).is_dir():
            raise FileNotFoundError(f"no Hugging Face model directory at {path} (models load by local path)")
        # Its own copy: the trainer updates its model while rollouts sample from this one.
        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device).eval()
        self.device = device
        self.policy_version = policy_version
        self.max_context = getattr(self.model.config, "max_position_embeddings", None)
        self.busy_seconds = 0.0
        self._lock = threading.Lock()

    def generate(self, requests: list[GenerationRequest]) -> list[list[Completion]]:
        with self._lock:
            started = time.monotonic()
            results = [self._one(request) for request in requests]
            seconds = time.monotonic() - started
            self.busy_seconds += seconds
            return stamp(results, seconds=seconds, policy_version=self.policy_version)

    @torch.no_grad()
    def _one(self, request: GenerationRequest) -> list[Completion]:
        max_new = request.max_new_tokens
        if self.max_context:
            max_new = min(max_new, self.max_context - len(request.prompt_ids))
        if max_new < 1:
            raise ValueError(f"prompt of {len(request.prompt_ids)} tokens leaves no room in a context of "
                             f"{self.max_context}")
        generator = None
        if request.seed is not None:
            generator = torch.Generator(device=self.device).manual_seed(request.seed)
        n = request.n
        ids = torch.tensor([request.prompt_ids] * n, device=self.device)  # (n, T)
        out = self.model(input_ids=ids, use_cache=True)
        cache, logits = out.past_key_values, out.logits[:, -1, :]
        stops = torch.tensor(request.stop_ids, device=self.device)
        finished = torch.zeros(n, dtype=torch.bool, device=self.device)
        attention = torch.ones(n, len(request.prompt_ids), dtype=torch.long, device=self.device)
        tokens, logprobs = [], []
        for _ in range(max_new):
            distribution = F.log_softmax(logits.float() / request.temperature, dim=-1)
            token = torch.multinomial(distribution.exp(), 1, generator=generator)  # (n, 1)
            tokens.append(token)
            logprobs.append(distribution.gather(1, token).squeeze(1))
            if len(stops):
                finished |= torch.isin(token.squeeze(1), stops)
                if bool(finished.all()):
                    break
            attention = torch.cat([attention, torch.ones(n, 1, dtype=torch.long, device=self.device)], dim=1)
            out = self.model(input_ids=token, past_key_values=cache, attention_mask=attention, use_cache=True)
            cache, logits = out.past_key_values, out.logits[:, -1, :]
        rows, row_logprobs = torch.cat(tokens, dim=1).cpu(), torch.stack(logprobs, dim=1).cpu()
        return [trim(row.tolist(), lps.tolist(), request.stop_ids, request.max_new_tokens)
                for row, lps in zip(rows, row_logprobs, strict=True)]

    def load_weights(self, state: dict, version: int) -> None:
        with self._lock:
            missing, unexpected = self.model.load_state_dict(state, strict=False)
            # Tied output embeddings may be absent from a state dict; anything else missing is a wrong model.
            missing = [name for name in missing if not name.endswith("lm_head.weight")]
            if missing or unexpected:
                raise ValueError(f"weights do not fit the engine's model: missing {missing[:5]}, "
                                 f"unexpected {unexpected[:5]}")
            self.policy_version = version

    def close(self) -> None:
        pass

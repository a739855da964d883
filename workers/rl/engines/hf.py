"""The `transformers` engine: any Hugging Face causal LM from a local path, sampling with its KV cache.

The sampling loop is ours (engines.sampling) rather than `model.generate`: a model's generation_config often
carries top_k, top_p or a repetition penalty, and the logprobs GRPO needs must be those of the distribution
the tokens were really drawn from — softmax(logits / temperature), exactly what the trainer recomputes.
"""

from __future__ import annotations

from pathlib import Path

import torch

from . import BatchingEngine, Completion, GenerationRequest, trim
from .sampling import sample_batch, sampling_request


class TransformersEngine(BatchingEngine):
    name = "transformers"

    def __init__(self, path: str, *, device: str = "cpu", policy_version: int = 0, dtype=torch.float32,
                 max_batch_rows: int = 512):
        from transformers import AutoModelForCausalLM

        if not Path(path).is_dir():
            raise FileNotFoundError(f"no Hugging Face model directory at {path} (models load by local path)")
        # Its own copy: the trainer updates its model while rollouts sample from this one.
        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device).eval()
        self.device = device
        self.max_context = getattr(self.model.config, "max_position_embeddings", None)
        super().__init__(policy_version=policy_version, max_batch_rows=max_batch_rows)

    def _step(self, idx, cache, positions, key_mask, select=None):
        if select is not None:
            cache.batch_select_indices(select)
        if key_mask is None:  # every row is real: the model's own full mask
            attention = None
        else:
            attention = key_mask.long()
        out = self.model(input_ids=idx, cache=cache, position_ids=positions, attention_mask=attention, use_cache=True)
        return out.logits, out.cache

    def _sample(self, requests: list[GenerationRequest]) -> list[list[Completion]]:
        sampled = sample_batch(self._step, [sampling_request(r) for r in requests], context=self.max_context,
                               device=self.device)
        return [[trim(tokens, logprobs, r.stop_ids, r.max_new_tokens) for tokens, logprobs in rows]
                for r, rows in zip(requests, sampled, strict=True)]

    def _load(self, state: dict) -> None:
        missing, unexpected = self.model.load_state_dict(state, strict=False)
        # Tied output embeddings may be absent from a state dict; anything else missing is a wrong model.
        missing = [name for name in missing if not name.endswith("lm_head.weight")]
        if missing or unexpected:
            raise ValueError(f"weights do not fit the engine's model: missing {missing[:5]}, "
                             f"unexpected {unexpected[:5]}")

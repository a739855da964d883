"""The `transformers` engine: any Hugging Face causal LM from a local path, batching continuously with its KV
cache (engines.sampling.ContinuousBatch, as the torch engine does).

The sampling loop is ours rather than `model.generate`: a model's generation_config often carries top_k, top_p
or a repetition penalty, and the logprobs GRPO needs must be those of the distribution the tokens were really
drawn from — softmax(logits / temperature), exactly what the trainer recomputes. `generate` also runs one
batch to its longest row; here requests join and leave between two tokens. Only the last position's logits
are computed (`logits_to_keep=1`): a prefill of 100 prompts of 400 tokens over a 49k vocabulary would
otherwise hold 8 GB of logits it never reads.

The cache is transformers' DynamicCache; `select_cache` and `merge_caches` give ContinuousBatch the row and
column surgery it needs (the same as models/tiny_lm.py's for TinyLM's list of tensors).
"""

from __future__ import annotations

from pathlib import Path

import torch

from . import BatchingEngine, GenerationRequest
from .sampling import ContinuousBatch, SamplingRequest, sampling_request


def select_cache(cache, rows: torch.Tensor, start: int = 0):
    """Keep `rows` of every layer's keys and values, from column `start` on (columns all rows pad)."""
    for layer in cache.layers:
        layer.keys = layer.keys.index_select(0, rows)[:, :, start:]
        layer.values = layer.values.index_select(0, rows)[:, :, start:]
    return cache


def merge_caches(running, joining, width: int):
    """`joining`'s rows under `running`'s, both left-padded (with zeros, masked out) to `width` columns."""
    for mine, theirs in zip(running.layers, joining.layers, strict=True):
        mine.keys = torch.cat([_left_pad(mine.keys, width), _left_pad(theirs.keys, width)])
        mine.values = torch.cat([_left_pad(mine.values, width), _left_pad(theirs.values, width)])
    return running


def _left_pad(tensor: torch.Tensor, width: int) -> torch.Tensor:
    missing = width - tensor.shape[2]
    if missing == 0:
        return tensor
    return torch.cat([tensor.new_zeros(*tensor.shape[:2], missing, tensor.shape[3]), tensor], dim=2)


class TransformersEngine(BatchingEngine):
    name = "transformers"

    def __init__(self, path: str, *, device: str = "cpu", policy_version: int = 0, dtype=torch.float32,
                 max_batch_rows: int = 512, shared_model=None):
        """`shared_model`: the trainer's own model, sampled from as it is (a PeftModel too, its adapters
        unmerged) — only where sampling and training never overlap (a sync run). Otherwise the engine loads a
        copy of its own from `path`, which the trainer's updates reach through load_weights."""
        from transformers import AutoModelForCausalLM

        if shared_model is not None:
            self.model, self.shares_weights = shared_model.eval(), True
        elif not Path(path).is_dir():
            raise FileNotFoundError(f"no Hugging Face model directory at {path} (models load by local path)")
        else:
            self.model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device).eval()
        self.device = device
        self.max_context = getattr(self.model.config, "max_position_embeddings", None)
        super().__init__(policy_version=policy_version, max_batch_rows=max_batch_rows)

    @torch.no_grad()
    def _step(self, idx, cache, positions, key_mask):
        attention = None if key_mask is None else key_mask.long()  # None: every row is real, the model's own mask
        out = self.model(input_ids=idx, cache=cache, position_ids=positions, attention_mask=attention, use_cache=True,
                         logits_to_keep=1)
        return out.logits, out.cache

    def _open_batch(self) -> ContinuousBatch:
        return ContinuousBatch(self._step, select=select_cache, merge=merge_caches, context=self.max_context or 1 << 31,
                               device=self.device)

    def _sampling_request(self, request: GenerationRequest) -> SamplingRequest:
        return sampling_request(request)

    def _load(self, state: dict | None) -> None:
        if state is None:  # the trainer's own model, updated in place; it left it in training mode
            self.model.eval()
            return
        missing, unexpected = self.model.load_state_dict(state, strict=False)
        # Tied output embeddings may be absent from a state dict; anything else missing is a wrong model.
        missing = [name for name in missing if not name.endswith("lm_head.weight")]
        if missing or unexpected:
            raise ValueError(f"weights do not fit the engine's model: missing {missing[:5]}, "
                             f"unexpected {unexpected[:5]}")

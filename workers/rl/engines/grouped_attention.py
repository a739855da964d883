"""Grouped-query attention without copying the KV cache, in the transformers engine's steps of several tokens a row.

SmolLM2, like most recent models, has fewer key/value heads than query heads (3 and 9). transformers' SDPA
attention (integrations/sdpa_attention.py, 5.x) attends a decode step's one token a row on the key/value heads as
they are (`pack_gqa`); for a step of several tokens a row with a mask — speculative decoding's verifying step, a
prefill continuing a kept prompt (engines/hf.py) — it copies each layer's keys and values once per query head of a
group (`repeat_kv`), a new tensor three times the layer's cache. For 16 rows of 1,100 columns that is 2.4 GB
allocated and freed per step in blocks of 40 MB, above any mmap threshold glibc uses (at most 32 MiB; a run fixes
it at 1 MiB, models/allocator.py): each a fresh mapping whose pages the kernel faults in and zeroes. A prefill
after a kept prompt copies the prompt's keys and values expanded to every row of its group the same way.
transformers passes SDPA's `enable_gqa` instead only where no mask is given, since CUDA's fused kernels take none
with it; on the CPU torch's SDPA takes both.

`grouped()` marks the engine's calls: inside it, on the CPU, a step of several tokens a row with a mask attends
with `enable_gqa`; everything else (the trainer's forward and backward passes, CUDA, one token a row) goes to
transformers' own function unchanged. The override is registered under transformers' "sdpa" name
(AttentionInterface, its documented extension point) so that the masks the model builds stay SDPA's and a model
shared with the trainer needs no other setting. Measured in `bench engine`'s speculation figures (module docstring
of engines/speculation.py).
"""

from __future__ import annotations

import contextlib
import contextvars

from torch.nn import functional as F

_GROUPED = contextvars.ContextVar("studio_grouped_attention", default=False)
_TRANSFORMERS_SDPA = None  # transformers' own function, which everything but the engine's multi-token steps keeps


@contextlib.contextmanager
def grouped():
    """Within: the engine's multi-token steps attend grouped heads in place (this module's docstring)."""
    token = _GROUPED.set(True)
    try:
        yield
    finally:
        _GROUPED.reset(token)


def _attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kwargs):
    if (_GROUPED.get() and query.device.type == "cpu" and attention_mask is not None and query.shape[2] > 1
            and key.shape[1] != query.shape[1] and kwargs.get("position_bias") is None and not dropout):
        output = F.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask, scale=scaling,
                                                enable_gqa=True)
        return output.transpose(1, 2).contiguous(), None
    return _TRANSFORMERS_SDPA(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                              is_causal=is_causal, **kwargs)


def install() -> None:
    """Register the override (once; idempotent)."""
    global _TRANSFORMERS_SDPA
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if _TRANSFORMERS_SDPA is None:
        _TRANSFORMERS_SDPA = sdpa_attention_forward
        AttentionInterface.register("sdpa", _attention)

"""A tiny character-level transformer, nanoGPT-shaped: the base model the demo post-trains.

Small enough to pretrain in about a minute on two CPU cores, so the studio can show the whole story — the
base model knows the format but is unreliable; RL makes it reliable. Generation keeps a KV cache and returns
each sampled token's logprob under the sampling policy, which GRPO needs as the "old" policy.
"""

from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F


@dataclass
class ModelConfig:
    vocab_size: int
    block_size: int = 48  # longest prompt + completion, in characters
    n_layer: int = 2
    n_head: int = 4
    n_embd: int = 96


class Attention(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.n_head = config.n_head
        self.qkv = nn.Linear(config.n_embd, 3 * config.n_embd)
        self.proj = nn.Linear(config.n_embd, config.n_embd)

    def forward(self, x, cache=None, key_mask=None, use_cache=False, layer=None):
        """With `layer`, a decode step in a slot cache (engines.slot_cache): `cache.update` writes this token's keys
        and returns what the row attends, `key_mask` (B, 1, 1, S) says which."""
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))  # (B, nh, T, hs)
        if layer is not None:
            k, v = cache.update(k, v, layer)
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=key_mask)
            return self.proj(y.transpose(1, 2).reshape(B, T, C)), cache
        if use_cache:
            k, v, cache = _cached(cache, k, v)
        S = k.shape[2]
        # With a cache, the new queries sit after every cached key: only the new block needs a causal mask
        # (none at all for the one-token steps of sampling).
        offset = S - T
        if key_mask is not None:  # (B, S): left padding in a batch of prompts of different lengths
            causal = torch.ones(T, S, dtype=torch.bool, device=x.device).tril(diagonal=offset)
            itself = torch.zeros(T, S, dtype=torch.bool, device=x.device)
            itself[torch.arange(T), torch.arange(offset, S)] = True  # a pad query sees itself: no empty row
            mask = causal & (key_mask[:, None, None, :] | itself)  # (B, 1, T, S)
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        elif offset == 0:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        elif T == 1:
            y = F.scaled_dot_product_attention(q, k, v)
        else:
            mask = torch.ones(T, S, dtype=torch.bool, device=x.device).tril(diagonal=offset)
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.proj(y.transpose(1, 2).reshape(B, T, C)), cache


HEADROOM = 64  # columns a KV buffer grows by at least: appending a token is a write, not a copy of the cache


def _cached(cache, k, v):
    """A layer's KV cache is (keys, values, length): buffers (B, heads, capacity, dim) of which `length` columns
    are used. New keys are written in place (the buffers grow by doubling when full), so a token costs a write,
    not a copy of the whole cache. Returns the keys and values in use, and the cache."""
    B, heads, T, dim = k.shape
    if cache is None:
        keys, values, length = k.new_zeros(B, heads, T + HEADROOM, dim), v.new_zeros(B, heads, T + HEADROOM, dim), 0
    else:
        keys, values, length = cache
        if length + T > keys.shape[2]:
            extra = max(length + T, 2 * keys.shape[2]) - keys.shape[2]
            keys = torch.cat([keys, keys.new_zeros(B, heads, extra, dim)], dim=2)
            values = torch.cat([values, values.new_zeros(B, heads, extra, dim)], dim=2)
    keys[:, :, length:length + T] = k
    values[:, :, length:length + T] = v
    return keys[:, :, :length + T], values[:, :, :length + T], (keys, values, length + T)


class Block(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(config.n_embd), nn.LayerNorm(config.n_embd)
        self.attn = Attention(config)
        self.mlp = nn.Sequential(nn.Linear(config.n_embd, 4 * config.n_embd), nn.GELU(),
                                 nn.Linear(4 * config.n_embd, config.n_embd))

    def forward(self, x, cache=None, key_mask=None, use_cache=False, layer=None):
        attended, cache = self.attn(self.ln1(x), cache, key_mask, use_cache, layer)
        x = x + attended
        return x + self.mlp(self.ln2(x)), cache


class TinyLM(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.token = nn.Embedding(config.vocab_size, config.n_embd)
        self.position = nn.Embedding(config.block_size, config.n_embd)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.ln = nn.LayerNorm(config.n_embd)
        self.head = nn.Linear(config.n_embd, config.vocab_size, bias=False)

    def forward(self, idx, caches=None, start: int = 0, positions=None, key_mask=None, use_cache=False):
        """idx (B, T) -> logits (B, T, vocab), and (with use_cache) the per-layer KV caches extended by these T
        positions.

        positions (B, T) and key_mask (B, S) serve batches of left-padded prompts: each row's own positions, and
        which of the S keys (cached + new) are real tokens."""
        T = idx.shape[1]
        if positions is None:
            if start + T > self.config.block_size:
                raise ValueError(f"sequence of {start + T} exceeds block_size {self.config.block_size}")
            positions = torch.arange(start, start + T, device=idx.device)
        elif int(positions.max()) >= self.config.block_size:
            raise ValueError(f"position {int(positions.max())} exceeds block_size {self.config.block_size}")
        x = self.token(idx) + self.position(positions)
        caches = caches or [None] * len(self.blocks)
        new = []
        for block, cache in zip(self.blocks, caches, strict=True):
            x, cache = block(x, cache, key_mask, use_cache)
            new.append(cache)
        return self.head(self.ln(x)), new

    def sampling_step(self, idx, cache, positions, key_mask, select=None):
        """engines.sampling's view of the model: logits of the new positions and the cache extended; with
        `select`, only those rows of the cache are kept first (rows that stopped leave the batch)."""
        if select is not None:
            cache = select_rows(cache, select)
        return self(idx, cache, positions=positions, key_mask=key_mask, use_cache=True)

    def prefill_step(self, idx, positions, key_mask):
        """engines.sampling.ContinuousBatch's prefill: the last position's logits and each layer's keys and values."""
        logits, caches = self(idx, positions=positions, key_mask=key_mask, use_cache=True)
        return logits[:, -1], [(keys[:, :, :length], values[:, :, :length]) for keys, values, length in caches]

    def decode_step(self, idx, positions, cache, mask):
        """ContinuousBatch's decode step: one token per row, keys written into the slot cache (engines.slot_cache),
        `mask` (rows, 1, 1, width) what each row attends. Positions are the batch's (below the context by
        construction): no check that would read them back from the device."""
        x = self.token(idx) + self.position(positions)
        for layer, block in enumerate(self.blocks):
            x, _ = block(x, cache, mask, layer=layer)
        return self.head(self.ln(x))[:, -1]

    def verify_step(self, idx, positions, cache, mask):
        """ContinuousBatch's step of several tokens per row (speculative decoding's verification of drafts):
        decode_step over idx (rows, T), `mask` (rows, 1, T, width); the logits of every position (rows, T, vocab)."""
        x = self.token(idx) + self.position(positions)
        for layer, block in enumerate(self.blocks):
            x, _ = block(x, cache, mask, layer=layer)
        return self.head(self.ln(x))

    def continuous_batch(self, *, context: int, device, cuda_graphs: bool | None = None, speculation=None,
                         stats=None):
        """The torch engine's batch over this model (engines.sampling.ContinuousBatch): its prefill and decode,
        the decode steps recorded as CUDA graphs where `cuda_graphs` (None: on a CUDA device); drafts from the
        context verified as `speculation` says (engines.speculation; None: off), counted in `stats`."""
        from ..engines.decode_graphs import for_device
        from ..engines.sampling import ContinuousBatch

        return ContinuousBatch(self.prefill_step, self.decode_step, context=context, device=device,
                               score=self.score_step, decode_graphs=for_device(device, cuda_graphs),
                               verify=self.verify_step, speculation=speculation, stats=stats)

    def score_step(self, idx):
        """ContinuousBatch's scoring of a prompt: the logits of every position (prompt logprobs)."""
        return self(idx)[0]

    @torch.no_grad()
    def generate(self, prompt: list[int], *, samples: int, max_new_tokens: int,
                 stop: int | tuple[int, ...] | None = None, temperature: float = 1.0, seed: int | None = None):
        """`samples` completions of one prompt: tokens (samples, n) and their logprobs (samples, n) under the
        sampling distribution; positions after a stop token are padded with that token and logprob 0."""
        from ..engines.sampling import SamplingRequest, sample_batch

        stops = (stop,) if isinstance(stop, int) else tuple(stop or ())
        [rows] = sample_batch(self.sampling_step, [SamplingRequest(prompt, samples, max_new_tokens, stops, temperature,
                                                                   seed)],
                              context=self.config.block_size, device=self.head.weight.device)
        width = max(len(tokens) for tokens, _ in rows)
        pad = stops[0] if stops else 0
        tokens = torch.tensor([t + [pad] * (width - len(t)) for t, _ in rows])
        logprobs = torch.tensor([lp + [0.0] * (width - len(lp)) for _, lp in rows])
        return tokens, logprobs


def select_rows(cache: list, rows: torch.Tensor, start: int = 0) -> list:
    """The cache of those rows only, from column `start` on (columns before it are padding for every one of
    them): a copy of the columns in use, which the next token's write gives fresh headroom."""
    return [(k[:, :, start:n].index_select(0, rows), v[:, :, start:n].index_select(0, rows), n - start)
            for k, v, n in cache]


def sequence_logprobs(model: TinyLM, prompt: list[int], completions: torch.Tensor) -> torch.Tensor:
    """Logprobs of each completion token under `model` (with gradients), (samples, n): one forward pass."""
    prefix = torch.tensor([prompt] * completions.shape[0])
    full = torch.cat([prefix, completions], dim=1)
    logits, _ = model(full[:, :-1])
    logprobs = F.log_softmax(logits[:, len(prompt) - 1:, :], dim=-1)
    return logprobs.gather(2, completions.unsqueeze(2)).squeeze(2)

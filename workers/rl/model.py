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

    def forward(self, x, cache=None):
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))  # (B, nh, T, hs)
        if cache is not None and cache[0] is not None:
            k, v = torch.cat([cache[0], k], dim=2), torch.cat([cache[1], v], dim=2)
        # With a cache, the new queries sit after every cached key: only the new block needs a causal mask.
        offset = k.shape[2] - T
        mask = torch.ones(T, k.shape[2], dtype=torch.bool, device=x.device).tril(diagonal=offset)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.proj(y.transpose(1, 2).reshape(B, T, C)), (k, v)


class Block(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(config.n_embd), nn.LayerNorm(config.n_embd)
        self.attn = Attention(config)
        self.mlp = nn.Sequential(nn.Linear(config.n_embd, 4 * config.n_embd), nn.GELU(),
                                 nn.Linear(4 * config.n_embd, config.n_embd))

    def forward(self, x, cache=None):
        attended, cache = self.attn(self.ln1(x), cache)
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

    def forward(self, idx, caches=None, start: int = 0):
        """idx (B, T) -> logits (B, T, vocab), and the per-layer KV caches extended by these T positions."""
        T = idx.shape[1]
        if start + T > self.config.block_size:
            raise ValueError(f"sequence of {start + T} exceeds block_size {self.config.block_size}")
        positions = torch.arange(start, start + T, device=idx.device)
        x = self.token(idx) + self.position(positions)
        caches = caches or [None] * len(self.blocks)
        new = []
        for block, cache in zip(self.blocks, caches, strict=True):
            x, cache = block(x, cache)
            new.append(cache)
        return self.head(self.ln(x)), new

    @torch.no_grad()
    def generate(self, prompt: list[int], *, samples: int, max_new_tokens: int, stop: int | tuple[int, ...] | None = None,
                 temperature: float = 1.0, generator: torch.Generator | None = None):
        """`samples` completions of one prompt: tokens (samples, n) and their logprobs (samples, n) under the
        sampling distribution; positions after a stop token are padded with that token and logprob 0."""
        device = self.head.weight.device
        stops = torch.tensor([stop] if isinstance(stop, int) else list(stop or ()), device=device)
        idx = torch.tensor([prompt] * samples, device=device)
        logits, caches = self(idx)
        start = len(prompt)
        tokens, logprobs = [], []
        finished = torch.zeros(samples, dtype=torch.bool, device=device)
        padding = torch.full((samples, 1), int(stops[0]) if len(stops) else 0, device=device)
        for step in range(max_new_tokens):
            distribution = F.log_softmax(logits[:, -1, :] / temperature, dim=-1)
            token = torch.multinomial(distribution.exp(), 1, generator=generator)  # (samples, 1)
            logprob = distribution.gather(1, token).squeeze(1)
            if len(stops):
                token = torch.where(finished.unsqueeze(1), padding, token)
                logprob = torch.where(finished, torch.zeros_like(logprob), logprob)
                finished |= torch.isin(token.squeeze(1), stops)
            tokens.append(token)
            logprobs.append(logprob)
            if len(stops) and bool(finished.all()) or start + step + 1 >= self.config.block_size:
                break
            logits, caches = self(token, caches, start=start + step)
        return torch.cat(tokens, dim=1), torch.stack(logprobs, dim=1)


def sequence_logprobs(model: TinyLM, prompt: list[int], completions: torch.Tensor) -> torch.Tensor:
    """Logprobs of each completion token under `model` (with gradients), (samples, n): one forward pass."""
    prefix = torch.tensor([prompt] * completions.shape[0])
    full = torch.cat([prefix, completions], dim=1)
    logits, _ = model(full[:, :-1])
    logprobs = F.log_softmax(logits[:, len(prompt) - 1:, :], dim=-1)
    return logprobs.gather(2, completions.unsqueeze(2)).squeeze(2)

"""Sampling many requests as one batch with a KV cache, for any model that takes per-row positions and a key
mask: the project's TinyLM and Hugging Face causal LMs alike.

Prompts of different lengths are left-padded (each row keeps its own positions, padding is masked out of
attention); each step is one forward pass for every row still sampling; a row that stops leaves the batch
(its cache rows are dropped), so a long tail of rows costs only what it computes. Each request draws from its
own generator. Logprobs are those of the distribution sampled from: softmax(logits / temperature) — exactly
what the trainer recomputes (policy.token_logprobs).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.nn import functional as F


@dataclass
class SamplingRequest:
    prompt: list[int]
    n: int
    max_new_tokens: int
    stops: tuple[int, ...]
    temperature: float = 1.0
    generator: torch.Generator | None = None


# step(idx (B, T), cache, positions (B, T), key_mask (B, S) or None, select (rows to keep) or None)
#   -> (logits (B, T, vocab), cache)
SamplingStep = Callable


@torch.no_grad()
def sample_batch(step: SamplingStep, requests: list[SamplingRequest], *, context: int | None,
                 device) -> list[list[tuple[list[int], list[float]]]]:
    """Per request, per row: (token ids, logprobs), the stop id included when the row stopped."""
    owners = [index for index, request in enumerate(requests) for _ in range(request.n)]
    prompts = [requests[owner].prompt for owner in owners]
    budgets = [requests[o].max_new_tokens if context is None else
               min(requests[o].max_new_tokens, context - len(requests[o].prompt)) for o in owners]
    if min(budgets, default=1) < 1:
        raise ValueError(f"a prompt of {max(len(p) for p in prompts)} tokens leaves no room in a context of "
                         f"{context}")
    width = max(len(p) for p in prompts)
    pads = torch.tensor([width - len(p) for p in prompts], device=device)
    idx = torch.tensor([[0] * (width - len(p)) + p for p in prompts], device=device)
    columns = torch.arange(width, device=device)[None, :]
    positions = (columns - pads[:, None]).clamp(min=0)
    key_mask = (columns >= pads[:, None]) if bool(pads.any()) else None
    logits, cache = step(idx, None, positions, key_mask)
    last = logits[:, -1, :]
    next_position = torch.tensor([len(p) for p in prompts], device=device)
    temperatures = torch.tensor([requests[o].temperature for o in owners], device=device)[:, None]
    stop_sets = [set(requests[o].stops) for o in owners]
    out = [[([], []) for _ in range(request.n)] for request in requests]
    row_slot = [(index, slot) for index, request in enumerate(requests) for slot in range(request.n)]
    active = list(range(len(owners)))  # original row numbers, in batch order
    for number in range(max(budgets)):
        distribution = F.log_softmax(last.float() / temperatures, dim=-1)  # (rows, vocab)
        probabilities = distribution.exp()
        tokens = torch.empty(len(active), dtype=torch.long, device=device)
        by_request: dict[int, list[int]] = {}
        for position, row in enumerate(active):
            by_request.setdefault(owners[row], []).append(position)
        for owner, rows in by_request.items():
            chosen = torch.tensor(rows, device=device)
            tokens[chosen] = torch.multinomial(probabilities[chosen], 1, generator=requests[owner].generator).squeeze(1)
        logprobs = distribution.gather(1, tokens[:, None]).squeeze(1).tolist()
        sampled = tokens.tolist()
        keep = []
        for position, row in enumerate(active):
            owner, slot = row_slot[row]
            out[owner][slot][0].append(sampled[position])
            out[owner][slot][1].append(logprobs[position])
            if sampled[position] not in stop_sets[row] and number + 1 < budgets[row]:
                keep.append(position)
        if not keep:
            break
        select = None
        if len(keep) < len(active):  # finished rows leave the batch
            select = torch.tensor(keep, device=device)
            tokens, next_position, temperatures = tokens[select], next_position[select], temperatures[select]
            if key_mask is not None:
                key_mask = key_mask.index_select(0, select)
            active = [active[p] for p in keep]
        if key_mask is not None:
            key_mask = torch.cat([key_mask, key_mask.new_ones(len(active), 1)], dim=1)
        logits, cache = step(tokens[:, None], cache, next_position[:, None], key_mask, select)
        last = logits[:, -1, :]
        next_position = next_position + 1
    return out

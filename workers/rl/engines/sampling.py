"""Sampling many requests as one batch with a KV cache, for any model that takes per-row positions and a key
mask: the project's TinyLM and Hugging Face causal LMs alike.

Prompts of different lengths are left-padded (each row keeps its own positions, padding is masked out of
attention); each step is one forward pass for every row still sampling; a row that stops leaves the batch
(its cache rows are dropped), so a long tail of rows costs only what it computes. Each request draws from its
own random stream. Logprobs are those of the distribution sampled from: softmax(logits / temperature) — exactly
what the trainer recomputes (policy.token_logprobs).
"""

from __future__ import annotations

import random
import time
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
    seed: int | None = None  # the request's own random stream: its samples do not depend on its neighbours


def draw(probabilities: torch.Tensor, uniforms: list[float]) -> torch.Tensor:
    """One token per row by inverse CDF: rows (B, vocab) of probabilities, one uniform in [0, 1) per row.

    The uniforms come from each request's own `random.Random`, one number per row and token: a Python float
    costs far less than a call into a torch.Generator per request, which dominated batches of many small
    requests."""
    cumulative = probabilities.cumsum(dim=-1)
    u = torch.tensor(uniforms, dtype=cumulative.dtype, device=cumulative.device)[:, None] * cumulative[:, -1:]
    return torch.searchsorted(cumulative, u).squeeze(1).clamp(max=probabilities.shape[-1] - 1)


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
    streams = [random.Random(request.seed) for request in requests]
    active = list(range(len(owners)))  # original row numbers, in batch order
    for number in range(max(budgets)):
        distribution = F.log_softmax(last.float() / temperatures, dim=-1)  # (rows, vocab)
        tokens = draw(distribution.exp(), [streams[owners[row]].random() for row in active])
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


class ContinuousBatch:
    """Continuous batching for models whose KV cache is a list of (keys, values) tensors (B, heads, S, dim),
    as the project's TinyLM keeps it: requests join the running batch between two tokens (their prompts are
    prefilled and their cache rows merged in, left-padded to a common length) and leave as soon as all their
    rows have stopped. A 4-token answer never waits for a 400-token one to finish.

    Each row's compute is the sum of its shares of the forward passes it took part in."""

    def __init__(self, step: SamplingStep, *, context: int, device):
        self.step, self.context, self.device = step, context, device
        self.rows: list[dict] = []  # per active row: request index, slot, budget, stops
        self.entries: list[dict] = []  # per admitted request: request, handle, rows' tokens/logprobs/compute, left
        self.cache = None
        self.key_mask = None  # (B, S) bool
        self.next_position = None  # (B,)
        self.temperatures = None  # (B, 1)
        self.last = None  # (B, vocab) logits of each row's next token

    def __len__(self) -> int:
        return len(self.rows)

    def admit(self, request: SamplingRequest, handle) -> None:
        """Prefill `request` (its n rows share the prompt) and merge its rows into the batch."""
        budget = min(request.max_new_tokens, self.context - len(request.prompt))
        if budget < 1:
            raise ValueError(f"a prompt of {len(request.prompt)} tokens leaves no room in a context of "
                             f"{self.context}")
        started = time.monotonic()
        idx = torch.tensor([request.prompt] * request.n, device=self.device)
        positions = torch.arange(len(request.prompt), device=self.device)[None, :].expand(request.n, -1)
        logits, cache = self.step(idx, None, positions, None)
        key_mask = torch.ones(request.n, len(request.prompt), dtype=torch.bool, device=self.device)
        prefill = (time.monotonic() - started) / request.n
        entry = {"request": request, "handle": handle, "tokens": [[] for _ in range(request.n)],
                 "logprobs": [[] for _ in range(request.n)], "compute": [prefill] * request.n, "left": request.n,
                 "stream": random.Random(request.seed)}
        self.entries.append(entry)
        rows = [{"entry": entry, "slot": slot, "budget": budget, "stops": set(request.stops)} for slot in range(request.n)]
        temperatures = torch.full((request.n, 1), float(request.temperature), device=self.device)
        next_position = torch.full((request.n,), len(request.prompt), device=self.device)
        if not self.rows:
            self.cache, self.key_mask, self.last = cache, key_mask, logits[:, -1, :]
            self.next_position, self.temperatures, self.rows = next_position, temperatures, rows
            return
        width = max(self.key_mask.shape[1], key_mask.shape[1])

        def left_pad(tensor, length, value=0.0):  # (B, heads, S, dim) or (B, S)
            missing = length - tensor.shape[-2 if tensor.dim() == 4 else -1]
            if missing == 0:
                return tensor
            shape = list(tensor.shape)
            shape[-2 if tensor.dim() == 4 else -1] = missing
            return torch.cat([torch.full(shape, value, dtype=tensor.dtype, device=tensor.device), tensor],
                             dim=-2 if tensor.dim() == 4 else -1)

        self.cache = [(torch.cat([left_pad(k0, width), left_pad(k1, width)]),
                       torch.cat([left_pad(v0, width), left_pad(v1, width)]))
                      for (k0, v0), (k1, v1) in zip(self.cache, cache, strict=True)]
        self.key_mask = torch.cat([left_pad(self.key_mask, width, False), left_pad(key_mask, width, False)])
        self.last = torch.cat([self.last, logits[:, -1, :]])
        self.next_position = torch.cat([self.next_position, next_position])
        self.temperatures = torch.cat([self.temperatures, temperatures])
        self.rows += rows

    def advance(self) -> list[dict]:
        """One token for every row. Returns the entries whose rows have all stopped (their `tokens`,
        `logprobs` and `compute` complete), and drops them from the batch."""
        started = time.monotonic()
        distribution = F.log_softmax(self.last.float() / self.temperatures, dim=-1)
        tokens = draw(distribution.exp(), [row["entry"]["stream"].random() for row in self.rows])
        logprobs = distribution.gather(1, tokens[:, None]).squeeze(1).tolist()
        sampled = tokens.tolist()
        keep, finished = [], []
        for position, row in enumerate(self.rows):
            entry, slot = row["entry"], row["slot"]
            entry["tokens"][slot].append(sampled[position])
            entry["logprobs"][slot].append(logprobs[position])
            if sampled[position] not in row["stops"] and len(entry["tokens"][slot]) < row["budget"]:
                keep.append(position)
            else:
                entry["left"] -= 1
                if entry["left"] == 0:
                    finished.append(entry)
        took_part = [(row["entry"], row["slot"]) for row in self.rows]
        if len(keep) < len(self.rows):
            select = torch.tensor(keep, dtype=torch.long, device=self.device)
            self.cache = [(k.index_select(0, select), v.index_select(0, select)) for k, v in self.cache]
            self.key_mask, tokens = self.key_mask.index_select(0, select), tokens.index_select(0, select)
            self.next_position = self.next_position.index_select(0, select)
            self.temperatures = self.temperatures.index_select(0, select)
            self.rows = [self.rows[p] for p in keep]
        if self.rows:
            self.key_mask = torch.cat([self.key_mask, self.key_mask.new_ones(len(self.rows), 1)], dim=1)
            logits, self.cache = self.step(tokens[:, None], self.cache, self.next_position[:, None], self.key_mask)
            self.last = logits[:, -1, :]
            self.next_position = self.next_position + 1
        share = (time.monotonic() - started) / len(took_part)
        for entry, slot in took_part:
            entry["compute"][slot] += share
        self.entries = [e for e in self.entries if e["left"] > 0]
        return finished

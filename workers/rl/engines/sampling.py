"""Sampling many requests as one batch with a KV cache, for any model that takes per-row positions and a key
mask: the project's TinyLM and Hugging Face causal LMs alike.

Prompts of different lengths are left-padded (each row keeps its own positions, padding is masked out of
attention); each step is one forward pass for every row still sampling; a row that stops leaves the batch
(its cache rows are dropped), so a long tail of rows costs only what it computes. Each request draws from its
own random stream. Logprobs are those of the distribution sampled from: softmax(logits / temperature) — exactly
what the trainer recomputes (policy.token_logprobs). Temperature 0 is greedy decoding (an evaluation's usual
setting): the most likely token, its logprob under the model's own distribution (temperature 1).
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
    on_token: Callable | None = None  # on_token(slot, token id), as each token is sampled (a streamed answer)


def draw(probabilities: torch.Tensor, uniforms: list[float]) -> torch.Tensor:
    """One token per row by inverse CDF: rows (B, vocab) of probabilities, one uniform in [0, 1) per row.

    The uniforms come from each request's own `random.Random`, one number per row and token: a Python float
    costs far less than a call into a torch.Generator per request, which dominated batches of many small
    requests."""
    cumulative = probabilities.cumsum(dim=-1)
    u = torch.tensor(uniforms, dtype=cumulative.dtype, device=cumulative.device)[:, None] * cumulative[:, -1:]
    return torch.searchsorted(cumulative, u).squeeze(1).clamp(max=probabilities.shape[-1] - 1)


def choose(last: torch.Tensor, temperatures: torch.Tensor, uniforms: list[float]) -> tuple[torch.Tensor, list]:
    """(token per row, its logprob) from the last logits (rows, vocab): drawn at each row's temperature (rows, 1),
    or the most likely one where the temperature is 0."""
    greedy = temperatures == 0
    distribution = F.log_softmax(last.float() / torch.where(greedy, torch.ones_like(temperatures), temperatures),
                                 dim=-1)
    tokens = draw(distribution.exp(), uniforms)
    if bool(greedy.any()):
        tokens = torch.where(greedy.squeeze(1), distribution.argmax(dim=-1), tokens)
    return tokens, distribution.gather(1, tokens[:, None]).squeeze(1).tolist()


# step(idx (B, T), cache, positions (B, T), key_mask (B, S) or None, select (rows to keep) or None)
#   -> (logits (B, T, vocab), cache)
SamplingStep = Callable


def sampling_request(request) -> SamplingRequest:
    """An engines.GenerationRequest as the sampler takes it."""
    return SamplingRequest(request.prompt_ids, request.n, request.max_new_tokens, tuple(request.stop_ids),
                           request.temperature, request.seed, request.on_token)


def prefill(step: SamplingStep, prompts: list[list[int]], device):
    """One forward pass over prompts of different lengths, left-padded, each row at its own positions.
    Returns the logits, the cache and the key mask (None when no row is padded)."""
    width = max(len(p) for p in prompts)
    pads = torch.tensor([width - len(p) for p in prompts], device=device)
    idx = torch.tensor([[0] * (width - len(p)) + p for p in prompts], device=device)
    columns = torch.arange(width, device=device)[None, :]
    positions = (columns - pads[:, None]).clamp(min=0)
    key_mask = (columns >= pads[:, None]) if bool(pads.any()) else None
    logits, cache = step(idx, None, positions, key_mask)
    return logits, cache, key_mask


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
    logits, cache, key_mask = prefill(step, prompts, device)
    last = logits[:, -1, :]
    next_position = torch.tensor([len(p) for p in prompts], device=device)
    temperatures = torch.tensor([requests[o].temperature for o in owners], device=device)[:, None]
    stop_sets = [set(requests[o].stops) for o in owners]
    out = [[([], []) for _ in range(request.n)] for request in requests]
    row_slot = [(index, slot) for index, request in enumerate(requests) for slot in range(request.n)]
    streams = [random.Random(request.seed) for request in requests]
    active = list(range(len(owners)))  # original row numbers, in batch order
    for number in range(max(budgets)):
        tokens, logprobs = choose(last, temperatures, [streams[owners[row]].random() for row in active])
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
    """Continuous batching: requests join the running batch between two tokens and leave as soon as all their
    rows have stopped, so a 4-token answer never waits for a 400-token one.

    Requests taken together are prefilled together (left-padded among themselves), then merged into the running
    batch, right-aligned to a common cache width (`merge`). A row that stops stays in the batch, masked and
    ignored, until a quarter of the rows are such (or the next merge): dropping rows copies the cache
    (`select`), so it is done in bulk. Each row's compute is its share of every forward pass it took part in.

    step(idx, cache, positions, key_mask) -> (logits, cache); select(cache, rows, first column) -> cache;
    merge(cache, cache, width) -> cache.

    Nothing here is recorded for autograd, whatever model it is given (the trainer's own requires gradients): the
    batch never drains while rollouts keep joining it, so a recorded graph would chain each token's cache to every
    write before it and keep all of them alive (the embedded demo's web process grew by gigabytes a minute)."""

    def __init__(self, step: SamplingStep, *, select: Callable, merge: Callable, context: int, device):
        self.step, self.select, self.merge, self.context, self.device = step, select, merge, context, device
        self._reset()

    def _reset(self) -> None:
        self.rows: list[dict] = []  # entry, slot, budget, stops, live
        self.entries: list[dict] = []  # request, handle, rows' tokens/logprobs/compute, rows left
        self.cache = self.key_mask = self.next_position = self.temperatures = self.last = None

    def __len__(self) -> int:
        return sum(row["live"] for row in self.rows)

    @torch.no_grad()
    def admit(self, items: list[tuple[SamplingRequest, object]]) -> list[tuple[object, Exception]]:
        """Prefill these requests and merge their rows in. Returns (handle, error) for requests refused."""
        refused, accepted = [], []
        for request, handle in items:
            budget = min(request.max_new_tokens, self.context - len(request.prompt))
            if budget < 1:
                refused.append((handle, ValueError(f"a prompt of {len(request.prompt)} tokens leaves no room in a "
                                                   f"context of {self.context}")))
            else:
                accepted.append((request, handle, budget))
        if not accepted:
            return refused
        started = time.monotonic()
        # Each prompt is computed once and its row copied for each of its samples: a GRPO group's n samples
        # share it (the tiny model's bench step spent three quarters of its sampling on prefilling copies).
        logits, cache, key_mask = prefill(self.step, [request.prompt for request, _, _ in accepted], self.device)
        owners = torch.tensor([index for index, (request, _, _) in enumerate(accepted) for _ in range(request.n)],
                              device=self.device)
        if len(owners) > len(accepted):
            logits, cache = logits.index_select(0, owners), self.select(cache, owners)
            key_mask = None if key_mask is None else key_mask.index_select(0, owners)
        prompts = [request.prompt for request, _, _ in accepted for _ in range(request.n)]
        width = max(len(p) for p in prompts)
        if key_mask is None:
            key_mask = torch.ones(len(prompts), width, dtype=torch.bool, device=self.device)
        prefill_share = (time.monotonic() - started) / len(prompts)
        rows = []
        for request, handle, budget in accepted:
            entry = {"request": request, "handle": handle, "tokens": [[] for _ in range(request.n)],
                     "logprobs": [[] for _ in range(request.n)], "compute": [prefill_share] * request.n,
                     "left": request.n, "stream": random.Random(request.seed)}
            self.entries.append(entry)
            rows += [{"entry": entry, "slot": slot, "budget": budget, "stops": set(request.stops), "live": True}
                     for slot in range(request.n)]
        temperatures = torch.tensor([[float(row["entry"]["request"].temperature)] for row in rows], device=self.device)
        next_position = torch.tensor([len(p) for p in prompts], device=self.device)
        if not self.rows:
            self.cache, self.key_mask, self.last = cache, key_mask, logits[:, -1, :]
            self.next_position, self.temperatures, self.rows = next_position, temperatures, rows
            return refused
        self._drop_stopped_rows()
        merged_width = max(self.key_mask.shape[1], width)
        self.cache = self.merge(self.cache, cache, merged_width)
        self.key_mask = torch.cat([_left_pad(self.key_mask, merged_width), _left_pad(key_mask, merged_width)])
        self.last = torch.cat([self.last, logits[:, -1, :]])
        self.next_position = torch.cat([self.next_position, next_position])
        self.temperatures = torch.cat([self.temperatures, temperatures])
        self.rows += rows
        return refused

    def _drop_stopped_rows(self) -> None:
        """Drop the stopped rows, and the leading columns that are padding for every row left (the batch never
        drains while requests keep coming, so without this its width would only grow)."""
        live = [position for position, row in enumerate(self.rows) if row["live"]]
        if len(live) == len(self.rows):
            return
        select = torch.tensor(live, dtype=torch.long, device=self.device)
        key_mask = self.key_mask.index_select(0, select)
        start = int(key_mask.any(dim=0).nonzero()[0])
        self.cache = self.select(self.cache, select, start)
        self.key_mask, self.last = key_mask[:, start:], self.last.index_select(0, select)
        self.next_position = self.next_position.index_select(0, select)
        self.temperatures = self.temperatures.index_select(0, select)
        self.rows = [self.rows[p] for p in live]

    @torch.no_grad()
    def advance(self) -> list[dict]:
        """One token for every live row. Returns the entries whose rows have all stopped (their `tokens`,
        `logprobs` and `compute` complete) and forgets them."""
        started = time.monotonic()
        tokens, logprobs = choose(self.last, self.temperatures, [row["entry"]["stream"].random() if row["live"]
                                                                 else 0.0 for row in self.rows])
        sampled = tokens.tolist()
        finished, took_part = [], []
        for position, row in enumerate(self.rows):
            if not row["live"]:
                continue
            entry, slot = row["entry"], row["slot"]
            took_part.append((entry, slot))
            entry["tokens"][slot].append(sampled[position])
            entry["logprobs"][slot].append(logprobs[position])
            if entry["request"].on_token is not None:
                entry["request"].on_token(slot, sampled[position])
            if sampled[position] in row["stops"] or len(entry["tokens"][slot]) >= row["budget"]:
                row["live"] = False
                entry["left"] -= 1
                if entry["left"] == 0:
                    finished.append(entry)
        live = len(self)
        if not live:
            self._reset()
        else:
            if len(self.rows) - live > max(8, len(self.rows) // 4):
                keep = [position for position, row in enumerate(self.rows) if row["live"]]
                self._drop_stopped_rows()
                tokens = tokens.index_select(0, torch.tensor(keep, dtype=torch.long, device=self.device))
            self.key_mask = torch.cat([self.key_mask, self.key_mask.new_ones(len(self.rows), 1)], dim=1)
            # Stopped rows still ride along until dropped; their position may have run past the context.
            positions = self.next_position.clamp(max=self.context - 1)[:, None]
            logits, self.cache = self.step(tokens[:, None], self.cache, positions, self.key_mask)
            self.last = logits[:, -1, :]
            self.next_position = self.next_position + 1
            self.entries = [e for e in self.entries if e["left"] > 0]
        share = (time.monotonic() - started) / max(len(took_part), 1)
        for entry, slot in took_part:
            entry["compute"][slot] += share
        return finished


def _left_pad(mask: torch.Tensor, width: int) -> torch.Tensor:
    """(B, S) key mask padded on the left with False to (B, width)."""
    missing = width - mask.shape[1]
    return mask if missing == 0 else torch.cat([mask.new_zeros(mask.shape[0], missing), mask], dim=1)

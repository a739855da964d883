"""Sampling many requests as one batch with a KV cache, for any model that takes per-row positions and a key
mask: the project's TinyLM and Hugging Face causal LMs alike.

The engines sample with ContinuousBatch: rows join and leave between two tokens, each in a slot of a
preallocated cache (slot_cache.py), so a decode step's cost does not grow with the rows it carries.
`sample_batch` (TinyLM.generate's) runs one batch to its end: prompts left-padded, a row that stops leaves the
batch (its cache rows are dropped). Each request draws from its own random stream. Logprobs are those of the
distribution sampled from: softmax(logits / temperature) — exactly what the trainer recomputes
(policy.token_logprobs). Temperature 0 is greedy decoding (an evaluation's usual setting): the most likely
token, its logprob under the model's own distribution (temperature 1)."""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.nn import functional as F

from .decode_graphs import DecodeGraphs
from .prefix_cache import PrefixCache
from .slot_cache import SlotCache
from .speculation import NgramIndex, Speculation, SpeculationStats, propose

try:  # the studio's Prometheus metrics; the GPU check runs the engine where prometheus-client is not installed
    from ...telemetry import SPECULATIVE_TOKENS
except ImportError:
    SPECULATIVE_TOKENS = None

KEPT_CACHE_BYTES = 256 << 20  # the largest slot cache a drained ContinuousBatch keeps for its next rows
# The same where its decode steps are recorded as CUDA graphs: a new cache would invalidate them all, and the next
# step would record them again (each recording synchronizes the device). SmolLM2's cache for 128 rows of 128 columns
# is 0.75 GB in fp32.
KEPT_RECORDED_CACHE_BYTES = 4 << 30
PAUSE_STEPS = 8  # steps a row decodes plainly after its drafts were all refused twice running (ContinuousBatch._adapt)


@dataclass
class SamplingRequest:
    prompt: list[int]
    n: int
    max_new_tokens: int
    stops: tuple[int, ...]
    temperature: float = 1.0
    seed: int | None = None  # the request's own random stream: its samples do not depend on its neighbours
    on_token: Callable | None = None  # on_token(slot, token id), as each token is sampled (a streamed answer)
    # engines.GenerationRequest's options for `serve` (ContinuousBatch reads them; sample_batch does not)
    top_logprobs: int = 0
    prompt_logprobs: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    stop_check: Callable | None = None


def draw(probabilities: torch.Tensor, uniforms: list[float]) -> torch.Tensor:
    """One token per row by inverse CDF: rows (B, vocab) of probabilities, one uniform in [0, 1) per row.

    The uniforms come from each request's own `random.Random`, one number per row and token: a Python float
    costs far less than a call into a torch.Generator per request, which dominated batches of many small
    requests."""
    cumulative = probabilities.cumsum(dim=-1)
    u = torch.tensor(uniforms, dtype=cumulative.dtype, device=cumulative.device)[:, None] * cumulative[:, -1:]
    return torch.searchsorted(cumulative, u).squeeze(1).clamp(max=probabilities.shape[-1] - 1)


def choose(last: torch.Tensor, temperatures: torch.Tensor, uniforms: list[float], *,
           greedy: bool, top: int = 0, excluded: list[int] | None = None):
    """(token per row, its logprob), both on the logits' device, from the last logits (rows, vocab): drawn at each
    row's temperature (rows, 1), or the most likely one where the temperature is 0 (`greedy`: some row's is, as
    the caller knows without asking the device). With `top`, a third item: the `top` likeliest tokens of each
    row's distribution, (logprobs, ids), each (rows, top). `excluded`: per row a token it must not draw (-1: none),
    a draft speculative decoding refused there — the row then draws from the rest, renormalised (`draw` scales by
    the total), and its logprob is still that of the whole distribution, the model's."""
    zero = temperatures == 0
    distribution = F.log_softmax(last.float() / torch.where(zero, torch.ones_like(temperatures), temperatures),
                                 dim=-1)
    probabilities = distribution.exp()
    if excluded is not None:
        rows = [row for row, token in enumerate(excluded) if token >= 0]
        probabilities[rows, [excluded[row] for row in rows]] = 0.0
    tokens = draw(probabilities, uniforms)
    if greedy:
        tokens = torch.where(zero.squeeze(1), distribution.argmax(dim=-1), tokens)
    chosen = distribution.gather(1, tokens[:, None]).squeeze(1)
    if top:
        return tokens, chosen, distribution.topk(min(top, distribution.shape[-1]), dim=-1)
    return tokens, chosen


def prompt_logprobs(logits: torch.Tensor, prompt: list[int], top: int) -> list:
    """Each prompt token's logprob under the model's own distribution (temperature 1) given the tokens before it,
    from the logits of every position (T, vocab): None for the first token, then (logprob, rank from 1,
    [(id, logprob)] of the `top` likeliest), as engines.Completion.prompt_logprobs holds them."""
    distribution = F.log_softmax(logits[:-1].float(), dim=-1)
    targets = torch.tensor(prompt[1:], device=logits.device)
    chosen = distribution.gather(1, targets[:, None])
    ranks = (distribution > chosen).sum(dim=-1) + 1
    best = distribution.topk(min(top, distribution.shape[-1]), dim=-1) if top else None
    out = [None]
    for position, (logprob, rank) in enumerate(zip(chosen.squeeze(1).tolist(), ranks.tolist(), strict=True)):
        alternatives = [] if best is None else list(zip(best.indices[position].tolist(),
                                                        best.values[position].tolist(), strict=True))
        out.append((logprob, rank, alternatives))
    return out


# step(idx (B, T), cache, positions (B, T), key_mask (B, S) or None, select (rows to keep) or None)
#   -> (logits (B, T, vocab), cache)
SamplingStep = Callable


def sampling_request(request) -> SamplingRequest:
    """An engines.GenerationRequest as the sampler takes it."""
    return SamplingRequest(request.prompt_ids, request.n, request.max_new_tokens, tuple(request.stop_ids),
                           request.temperature, request.seed, request.on_token, request.top_logprobs,
                           request.prompt_logprobs, request.presence_penalty, request.frequency_penalty,
                           request.stop_check)


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
        tokens, logprobs = choose(last, temperatures, [streams[owners[row]].random() for row in active],
                                  greedy=any(requests[owners[row]].temperature == 0 for row in active))
        sampled, logprobs = tokens.tolist(), logprobs.tolist()
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

    Requests taken together are prefilled together (left-padded among themselves, each prompt once however many
    samples share it), and each row's prompt cache is written into a free slot of the batch's SlotCache
    (slot_cache.py). A decode step is one forward pass over the occupied slots, whatever their number: its
    kernels do not grow with the rows. Sampling stays on the device; one read back per step (tokens and logprobs
    together) tells which rows stopped, and a stopped row frees its slot. When many low slots are free the live
    rows move down into them (a copy in bulk, not per step), so a long tail of rows costs only what it computes.
    Each row's compute is its share of every step it took part in.

    prefill(idx (B, T), positions (B, T), key_mask (B, T) or None) -> (last logits (B, vocab), [(keys, values)]
    per layer, each (B, kv heads, T, head dim)); decode(idx (R, 1), positions (R, 1), cache, mask (R, 1, 1, W))
    -> last logits (R, vocab), the model's attention calling cache.update(keys, values, layer). score(idx (1, T))
    -> the logits of every position (1, T, vocab): a request's prompt logprobs, computed only when asked (the
    prefill keeps the last position's alone).

    On a CUDA device the decode step is recorded as a CUDA graph per shape and replayed (decode_graphs.py): one
    launch instead of the forward pass's hundreds, the rows padded up to a bucket. The engine that opens the
    batch hands it its DecodeGraphs (decode_graphs.for_device), or None to decode eagerly.

    Nothing here is recorded for autograd, whatever model it is given (the trainer's own requires gradients): the
    batch never drains while rollouts keep joining it, so a recorded graph would chain each token's cache to every
    write before it and keep all of them alive (the embedded demo's web process grew by gigabytes a minute)."""

    def __init__(self, prefill: Callable, decode: Callable, *, context: int, device, score: Callable | None = None,
                 prefill_after: Callable | None = None, decode_graphs: DecodeGraphs | None = None,
                 verify: Callable | None = None, speculation: Speculation | None = None,
                 stats: SpeculationStats | None = None):
        self.prefill_step, self.decode_step, self.context, self.device = prefill, decode, context, device
        # Speculative decoding from the context (speculation.py), where the model can run a step of several tokens
        # per row (`verify`: decode's arguments with idx (R, T), positions (R, T), mask (R, 1, T, W) -> logits
        # (R, T, vocab)); its counts go to `stats`, the engine's.
        self.verify_step = verify
        self.speculation = speculation if verify is not None and speculation is not None and speculation.enabled \
            else None
        self.stats = stats if stats is not None else SpeculationStats()
        self.graphs = decode_graphs
        self.score_step, self.prefill_after = score, prefill_after
        # Kept prompts, reused by later ones that begin with them (prefix_cache.py); only where the model can
        # prefill after a given cache (`prefill_after`). Outlives the batch's drains, not new weights.
        self.prefixes = PrefixCache() if prefill_after is not None else None
        self.prefilled_tokens = self.reused_tokens = 0  # prompt tokens computed, and taken from kept prompts
        # Made at the first admission and kept when the batch drains if it holds at most KEPT_CACHE_BYTES: a sync
        # GRPO step's batch drains at every step, and making it anew (then growing it to the step's rows by copies)
        # cost the tiny workload's step about 6% on 2 cores (0.207 against 0.195 s). A bigger one (a long-context
        # batch on a GPU) is freed for the trainer's own tensors, which share the device between two steps —
        # unless its steps are CUDA graphs recorded against it (KEPT_RECORDED_CACHE_BYTES).
        self.cache: SlotCache | None = None
        self._reset()

    def _reset(self) -> None:
        self.rows: list[dict] = []  # live rows in admission order: entry, sample, slot, budget, stops, length
        self.entries: list[dict] = []  # request, handle, rows' tokens/logprobs/compute, rows left
        self.occupant: list[dict | None] = []  # slot -> its row; a drained batch's cache holds no row
        self.last = self.temperatures = None  # (slots in use, vocab) logits to sample from; (slots in use, 1)

    def __len__(self) -> int:
        return len(self.rows)

    @torch.no_grad()
    def admit(self, items: list[tuple[SamplingRequest, object]]) -> tuple[list[tuple[object, Exception]], list[dict]]:
        """Prefill these requests and write their rows into free slots. Returns (handle, error) for requests
        refused, and the entries already finished: those asking for no new tokens (a scoring of the prompt)."""
        refused, accepted, finished = [], [], []
        for request, handle in items:
            budget = min(request.max_new_tokens, self.context - len(request.prompt))
            if request.prompt_logprobs is not None and self.score_step is None:
                refused.append((handle, ValueError("this engine does not compute prompt logprobs")))
            elif len(request.prompt) > self.context or (budget < 1 and request.max_new_tokens > 0):
                refused.append((handle, ValueError(f"a prompt of {len(request.prompt)} tokens leaves no room in a "
                                                   f"context of {self.context}")))
            else:
                started = time.monotonic()
                entry = {"request": request, "handle": handle, "tokens": [[] for _ in range(request.n)],
                         "logprobs": [[] for _ in range(request.n)], "top": [[] for _ in range(request.n)],
                         "compute": [0.0] * request.n, "left": request.n, "stream": random.Random(request.seed),
                         "prompt_logprobs": None, "prompt_index": None}
                if request.prompt_logprobs is not None:
                    logits = self.score_step(torch.tensor([request.prompt], device=self.device))[0]
                    entry["prompt_logprobs"] = prompt_logprobs(logits, request.prompt, request.prompt_logprobs)
                    entry["compute"] = [(time.monotonic() - started) / request.n] * request.n
                if request.max_new_tokens < 1:
                    finished.append(entry)
                else:
                    accepted.append((entry, budget))
        if not accepted:
            return refused, finished
        for shared, past, group in self._by_kept_prefix(accepted):
            self._admit_group(group, shared, past)
        return refused, finished

    def weights_changed(self) -> None:
        """The model's weights are new: kept prompts' keys and values are not theirs."""
        if self.prefixes is not None:
            self.prefixes.clear()

    def _by_kept_prefix(self, accepted: list) -> list:
        """The accepted requests grouped for prefilling: [(shared length, kept layers or None, requests)], the
        requests of a group continuing the same kept prompt (or none) over the same length."""
        if self.prefixes is None:
            return [(0, None, accepted)]
        groups: dict = {}
        for item in accepted:
            shared, past = self.prefixes.longest(item[0]["request"].prompt)
            groups.setdefault((shared, id(past)), (shared, past, []))[2].append(item)
        return list(groups.values())

    def _admit_group(self, accepted: list, shared: int, past) -> None:
        """Prefill these requests (after the first `shared` tokens, taken from `past`, a kept prompt's layers)
        and write their rows into free slots."""
        started = time.monotonic()
        prompts = [entry["request"].prompt for entry, _ in accepted]
        width = max(len(p) for p in prompts) - shared
        pads = torch.tensor([shared + width - len(p) for p in prompts], device=self.device)
        idx = torch.tensor([[0] * (shared + width - len(p)) + p[shared:] for p in prompts], device=self.device)
        columns = torch.arange(width, device=self.device)[None, :]
        positions = shared + (columns - pads[:, None]).clamp(min=0)
        padded = any(len(p) < shared + width for p in prompts)
        key_mask = (columns >= pads[:, None]) if padded else None
        if past is None:
            last, layers = self.prefill_step(idx, positions, key_mask)
        else:  # columns [0, shared) are the kept prompt's; a shorter row's padding sits between them and its rest
            last, layers = self.prefill_after([(k[:, :, :shared], v[:, :, :shared]) for k, v in past], idx, positions,
                                              key_mask)
        self.prefilled_tokens += sum(len(p) - shared for p in prompts)
        self.reused_tokens += shared * len(prompts)
        if self.cache is None:
            keys = layers[0][0]
            self.cache = SlotCache(len(layers), keys.shape[1], keys.shape[3], dtype=keys.dtype, device=self.device)
        # Each prompt is computed once and written into a slot per sample: a GRPO group's n samples share it.
        owners = [index for index, (entry, _) in enumerate(accepted) for _ in range(entry["request"].n)]
        slots = self._free_slots(len(owners))
        self.cache.reserve(max(slots) + 1, shared + width + 1)
        slot_tensor = torch.tensor(slots, device=self.device)
        owner_tensor = torch.tensor(owners, device=self.device) if len(owners) > len(accepted) else None
        self.cache.write(slot_tensor, layers, pads if padded else None,
                         torch.tensor([len(prompts[o]) for o in owners], device=self.device), owner_tensor,
                         start=shared)
        if self.prefixes is not None:
            for row, prompt in enumerate(prompts):  # its own columns, unpadded, copied out of the batch's tensors
                if not self.prefixes.worth_keeping(prompt):
                    continue
                pad = shared + width - len(prompt)
                own = [tuple(torch.cat([t[row:row + 1, :, :shared], t[row:row + 1, :, shared + pad:]], dim=2)
                             for t in pair) for pair in layers]
                self.prefixes.add(prompt, own)
        temperatures = torch.tensor([[float(accepted[o][0]["request"].temperature)] for o in owners],
                                    device=self.device)
        self._place(slot_tensor, last if owner_tensor is None else last.index_select(0, owner_tensor),
                    temperatures)
        prefill_share = (time.monotonic() - started) / len(owners)
        slots = iter(slots)
        for entry, budget in accepted:
            request = entry["request"]
            entry["compute"] = [seconds + prefill_share for seconds in entry["compute"]]
            self.entries.append(entry)
            drafting = self._drafts_for(request)
            if drafting:  # the prompt's n-grams, indexed once for its samples
                entry["prompt_index"] = NgramIndex(self.speculation.min_ngram, self.speculation.max_ngram)
                entry["prompt_index"].extend(request.prompt, len(request.prompt) - 1)
            for sample in range(request.n):
                row = {"entry": entry, "sample": sample, "slot": next(slots), "budget": budget,
                       "stops": set(request.stops), "length": len(request.prompt),
                       # speculating: the row's sequence so far, its own n-grams, a draft refused at its next token
                       "context": list(request.prompt) if drafting else None,
                       "index": NgramIndex(self.speculation.min_ngram, self.speculation.max_ngram,
                                           start=len(request.prompt) - 1) if drafting else None,
                       "refused": None, "limit": self.speculation.tokens if drafting else 0, "pause": 0}
                self.occupant[row["slot"]] = row
                self.rows.append(row)

    def _drafts_for(self, request: SamplingRequest) -> bool:
        """Whether this request's rows are drafted for. Not for a request asking for presence or frequency
        penalties (a draft's logits would need the penalties of the drafts before it) or for top_logprobs (the
        accepted drafts' alternatives are not read back): those decode plainly, beside drafted rows."""
        return (self.speculation is not None and not request.presence_penalty and not request.frequency_penalty
                and not request.top_logprobs)

    def _free_slots(self, count: int) -> list[int]:
        """The lowest `count` free slots (the batch's slot list grown as needed)."""
        free = [slot for slot, row in enumerate(self.occupant) if row is None][:count]
        free += range(len(self.occupant), len(self.occupant) + count - len(free))
        self.occupant += [None] * (max(free) + 1 - len(self.occupant))
        return free

    def _place(self, slots: torch.Tensor, last: torch.Tensor, temperatures: torch.Tensor) -> None:
        """New rows' logits and temperatures at their slots, the per-slot tensors grown to the slots in use."""
        used = len(self.occupant)
        if self.last is None:
            self.last = last.new_zeros(used, last.shape[1])
            self.temperatures = temperatures.new_ones(used, 1)
        if len(self.last) < used:  # the last decode step's logits cover the slots in use then
            self.last = torch.cat([self.last, self.last.new_zeros(used - len(self.last), self.last.shape[1])])
        if len(self.temperatures) < used:
            self.temperatures = torch.cat([self.temperatures,
                                           self.temperatures.new_ones(used - len(self.temperatures), 1)])
        self.last.index_copy_(0, slots, last.to(self.last.dtype))
        self.temperatures.index_copy_(0, slots, temperatures)

    @torch.no_grad()
    def advance(self) -> list[dict]:
        """One token for every live row (and, speculating, the drafts it accepted: engines/speculation.py).
        Returns the entries whose rows have all stopped (their `tokens`, `logprobs` and `compute` complete) and
        forgets them."""
        started = time.monotonic()
        used = len(self.occupant)
        # Each request's stream draws for its live rows in sample order, as it always has.
        uniforms = [0.0] * used
        excluded = None
        for row in self.rows:
            uniforms[row["slot"]] = row["entry"]["stream"].random()
            if row.get("refused") is not None:  # its last draft was refused: sampled from p without it
                excluded = excluded or [-1] * used
                excluded[row["slot"]], row["refused"] = row["refused"], None
        greedy = any(row["entry"]["request"].temperature == 0 for row in self.rows)
        top = max((entry["request"].top_logprobs for entry in self.entries), default=0)  # per request, not row
        chosen = choose(self._penalised(self.last[:used]), self.temperatures[:used], uniforms, greedy=greedy,
                        top=top, excluded=excluded)
        tokens, logprobs = chosen[0], chosen[1]
        sampled, sampled_logprobs = torch.stack([tokens.double(), logprobs.double()]).tolist()  # one read back
        best_logprobs, best_ids = (chosen[2].values.tolist(), chosen[2].indices.tolist()) if top else ((), ())
        finished, stopped, took_part = [], [], []
        for row in self.rows:
            slot = row["slot"]
            took_part.append((row["entry"], row["sample"]))
            request = row["entry"]["request"]
            best = None
            if request.top_logprobs:
                best = list(zip(best_ids[slot][:request.top_logprobs], best_logprobs[slot][:request.top_logprobs],
                                strict=True))
            if self._take(row, int(sampled[slot]), sampled_logprobs[slot], best):
                stopped.append(row)
        finished += self._stop(stopped)
        if self.rows:
            tokens = self._pack(tokens)
            drafts = self._drafts()
            if drafts:
                finished += self._speculate(drafts)
            else:
                used = len(self.occupant)
                rows = used if self.graphs is None else self.graphs.rows(used)  # padded with free slots for a graph
                width = max(row["length"] for row in self.rows)  # the new token's column included
                self.cache.reserve(rows, width)
                mask, positions = self.cache.prepare(rows, width)
                if self.graphs is None:
                    self.last = self.decode_step(tokens[:used, None], positions, self.cache, mask)
                else:
                    self.last = self.graphs.decode(self.decode_step, tokens, used, self.cache, mask, positions)
                self.cache.advance()
        if not self.rows:
            recorded = self.graphs is not None and self.graphs.capture
            if self.cache.bytes > (KEPT_RECORDED_CACHE_BYTES if recorded else KEPT_CACHE_BYTES):
                self.cache = None
            self._reset()
        share = (time.monotonic() - started) / max(len(took_part), 1)
        for entry, sample in took_part:
            entry["compute"][sample] += share
        return finished

    def _take(self, row: dict, token: int, logprob: float, top: list | None) -> bool:
        """Record a row's next token (streamed to its caller); True when the row stops with it."""
        entry, sample = row["entry"], row["sample"]
        request, written = entry["request"], entry["tokens"][sample]
        written.append(token)
        entry["logprobs"][sample].append(logprob)
        if top is not None:
            entry["top"][sample].append(top)
        row["length"] += 1
        if row["context"] is not None:
            row["context"].append(token)
        if request.on_token is not None:
            request.on_token(sample, token)
        return (token in row["stops"] or len(written) >= row["budget"]
                or (request.stop_check is not None and request.stop_check(written)))

    def _stop(self, stopped: list[dict]) -> list[dict]:
        """These rows are done: their slots freed. Returns the entries all of whose rows are now done."""
        if not stopped:
            return []
        finished = []
        for row in stopped:
            self.occupant[row["slot"]] = None
            row["entry"]["left"] -= 1
            if row["entry"]["left"] == 0:
                finished.append(row["entry"])
        self.rows = [row for row in self.rows if self.occupant[row["slot"]] is row]
        self.entries = [entry for entry in self.entries if entry["left"] > 0]
        self.cache.free(torch.tensor([row["slot"] for row in stopped], device=self.device))
        return finished

    def _drafts(self) -> dict[int, list[int]]:
        """slot -> the drafts of each row that has some (nothing when speculation is off for this step)."""
        if self.speculation is None or len(self.rows) > self.speculation.max_rows:
            return {}
        drafts = {}
        for row in self.rows:
            if row["context"] is None:
                continue
            if row["pause"]:
                row["pause"] -= 1
                continue
            room = min(row["limit"], row["budget"] - len(row["entry"]["tokens"][row["sample"]]))
            if room > 0:
                found = propose(row["context"], row["index"], row["entry"]["prompt_index"], room)
                if found:
                    drafts[row["slot"]] = found
        return drafts

    def _adapt(self, row: dict, accepted: int, drafted: int) -> None:
        """A row's next draft length from how its last drafts fared: one more than it accepted (up to the
        setting's), so a row copying text drafts long and one whose lookups miss drafts short; after drafts all
        refused at one draft, the row decodes plainly for PAUSE_STEPS steps. A verifying step is wider for every
        row in it, so drafts that keep failing cost the whole batch (the short-answer workload's rows)."""
        if accepted == drafted:
            row["limit"] = min(self.speculation.tokens, row["limit"] + 1)
        elif accepted:
            row["limit"] = accepted + 1
        elif row["limit"] > 1:
            row["limit"] = 1
        else:
            row["pause"] = PAUSE_STEPS

    def _speculate(self, drafts: dict[int, list[int]]) -> list[dict]:
        """One forward pass over every row's last token and its drafts (a row without drafts is padded), the drafts
        checked against the model's own distribution at each position (engines/speculation.py), the accepted
        ones recorded as sampled tokens. Each row's cache keeps its token and its accepted drafts, and its next
        logits are those after the last of them. Returns the entries finished by an accepted draft."""
        used = len(self.occupant)
        span = 1 + max(len(found) for found in drafts.values())
        inputs = [[0] * span for _ in range(used)]
        for row in self.rows:
            found = drafts.get(row["slot"], ())
            inputs[row["slot"]][:1 + len(found)] = [row["entry"]["tokens"][row["sample"]][-1], *found]
        idx = torch.tensor(inputs, device=self.device)
        width = max(row["length"] for row in self.rows) + span - 1
        self.cache.reserve(used, width)
        mask, positions = self.cache.prepare_span(used, width, span, limit=self.context)
        logits = self.verify_step(idx, positions, self.cache, mask)  # (used, span, vocab)
        temperatures = self.temperatures[:used]
        zero = temperatures == 0
        distribution = F.log_softmax(
            logits[:, :-1].float() / torch.where(zero, torch.ones_like(temperatures), temperatures)[:, :, None], dim=-1)
        drafted = idx[:, 1:, None]
        checked = [distribution.gather(2, drafted).squeeze(2).double()]
        greedy = any(row["entry"]["request"].temperature == 0 for row in self.rows)
        if greedy:
            checked.append(distribution.argmax(dim=-1).double())
        checked = torch.stack(checked).tolist()  # one read back: each draft's logprob (and the likeliest ids)
        kept = [0] * used
        stopped, stats = [], self.stats
        stats.steps += 1
        for row in self.rows:
            slot = row["slot"]
            found = drafts.get(slot, ())
            stats.drafted += len(found)
            request, stream = row["entry"]["request"], row["entry"]["stream"]
            for position, token in enumerate(found):
                logprob = checked[0][slot][position]
                if request.temperature == 0:
                    accept = int(checked[1][slot][position]) == token
                else:
                    accept = stream.random() < math.exp(logprob)
                if not accept:
                    row["refused"] = token if request.temperature != 0 else None
                    break
                kept[slot] += 1
                stats.accepted += 1
                if self._take(row, token, logprob, None):
                    stopped.append(row)
                    break
            if found:
                self._adapt(row, kept[slot], len(found))
        if SPECULATIVE_TOKENS is not None:
            SPECULATIVE_TOKENS.labels("drafted").inc(sum(len(found) for found in drafts.values()))
            SPECULATIVE_TOKENS.labels("accepted").inc(sum(kept))
        kept_tensor = torch.tensor(kept, device=self.device)
        self.cache.advance_by(kept_tensor + 1)
        self.last = logits[torch.arange(used, device=self.device), kept_tensor]
        return self._stop(stopped)

    def _penalised(self, last: torch.Tensor) -> torch.Tensor:
        """The logits with each row's presence and frequency penalties applied to the tokens it has sampled so
        far (the OpenAI API's definition, as vLLM applies them: before the temperature); `last` itself when no
        row asks for any, as a rollout never does."""
        if not any(entry["request"].presence_penalty or entry["request"].frequency_penalty for entry in self.entries):
            return last
        last = last.clone()
        for row in self.rows:
            request, sampled = row["entry"]["request"], row["entry"]["tokens"][row["sample"]]
            if sampled and (request.presence_penalty or request.frequency_penalty):
                counts = torch.bincount(torch.tensor(sampled, device=last.device), minlength=last.shape[1])
                counts = counts[:last.shape[1]].to(last.dtype)
                last[row["slot"]] -= request.frequency_penalty * counts + request.presence_penalty * (counts > 0)
        return last

    def _pack(self, tokens: torch.Tensor) -> torch.Tensor:
        """Drop free slots at the top; when free slots are many below live ones, move those rows down into them
        (one copy in bulk). Returns the tokens to decode, in the rows' new slots."""
        while self.occupant and self.occupant[-1] is None:
            self.occupant.pop()
        live = len(self.rows)
        if len(self.occupant) - live <= max(8, live // 4):
            return tokens
        movers = [row for row in self.rows if row["slot"] >= live]
        holes = [slot for slot in range(live) if self.occupant[slot] is None]
        sources = torch.tensor([row["slot"] for row in movers], device=self.device)
        targets = torch.tensor(holes, device=self.device)
        self.cache.move(sources, targets)
        for row, slot in zip(movers, holes, strict=True):
            self.occupant[slot], row["slot"] = row, slot
        del self.occupant[live:]
        self.temperatures.index_copy_(0, targets, self.temperatures.index_select(0, sources))
        return tokens.index_copy(0, targets, tokens.index_select(0, sources))

"""Inference engines behind one interface: generate groups of samples with their logprobs; load new weights.

- `torch`: the project's own TinyLM with a KV cache, on the CPU or a GPU (torch_engine.py).
- `transformers`: any Hugging Face causal LM loaded from a local path, with transformers' KV cache (hf.py).
- `vllm`: for GPU workers (vllm_engine.py); vLLM is imported only when this engine is built, and runs in the
  GPU worker's own environment (requirements/gpu.txt), since it pins its own torch and transformers.
- `server` (server.py): rollouts on OpenAI-compatible inference servers (the studio's `serve`, or vLLM's server),
  the weights published to the blob storage after each step and loaded by every server; not a BatchingEngine
  (the servers batch), but the same `generate` / `load_weights` / `policy_version` the pipeline uses.

All three share `BatchingEngine`: many rollout threads call `generate` at once, and one loop hands the model
everything waiting. The torch and transformers engines batch continuously: requests join the running batch
between two tokens and leave when done, so a short answer never waits behind a long one. vLLM runs one
`LLM.generate` call over everything waiting (it batches continuously inside); requests that arrive meanwhile
form the next call. New weights wait beside the model and are swapped in between two batches (two
tokens, when continuous), so the trainer never waits for a batch of long samples to finish. In a sync run the
torch and transformers engines sample from the trainer's own model instead (`shares_weights`), as TRL does
without vLLM: no copy of the weights per step. A LoRA run keeps a copy with the adapters merged in
(models/build.py says why: unmerged adapters decode slower on a CPU than the copy costs). Each engine counts
the seconds it spent generating, shared out as each completion's policy compute cost.

A caller that alone submits all of a step's requests at once (the sync pipeline) gets the same batches, and
so the same samples, in every run with the same seed: that is what makes a sync resume bit-identical.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field

from .speculation import SpeculationStats

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GenerationRequest:
    prompt_ids: list[int]
    n: int  # samples of this prompt
    max_new_tokens: int
    stop_ids: tuple[int, ...]
    temperature: float = 1.0
    seed: int | None = None  # fixes the sampling of this request
    # The same conversation as messages, for an engine behind a chat API (endpoint.py), which tokenises on its
    # own side; the engines here read `prompt_ids`.
    messages: tuple[dict, ...] = ()
    tools: tuple[dict, ...] = ()
    # What `serve` asks beyond a rollout's needs (the OpenAI API's options): the `top_logprobs` likeliest tokens
    # beside each sampled one; each prompt token's logprob under the model (`prompt_logprobs`: None for none, else
    # that many alternatives beside each; `max_new_tokens` may then be 0, a scoring of the prompt alone); presence
    # and frequency penalties on the logits of tokens already sampled (as the API and vLLM define them).
    top_logprobs: int = 0
    prompt_logprobs: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    # Called with (sample index, token id) as each token is sampled, by the engines that batch continuously (the
    # torch and transformers ones): what `serve` streams. Not part of the request's identity.
    on_token: Callable | None = field(default=None, compare=False)
    # stop_check(a sample's token ids so far) -> True to stop that sample now: `serve`'s stop strings, which need
    # the tokenizer. Read by the engines that batch continuously; others run to a stop id or the budget.
    stop_check: Callable | None = field(default=None, compare=False)


@dataclass
class Completion:
    token_ids: list[int]  # the sampled ids, the stop id included when the model stopped
    logprobs: list[float]  # of each sampled id under the sampling distribution (temperature applied)
    finish_reason: str  # stop | length | error (no answer: the engine's infrastructure failed, `error` says how)
    compute_seconds: float = 0.0  # this completion's share of the engine's busy time (its policy cost)
    policy_version: int = 0  # the weights that sampled it (the oldest, when new ones arrived while it was sampled)
    # The version of the weights that sampled each token, where new weights arrived mid-completion (the engines
    # that batch continuously swap them between two tokens); empty: every token is `policy_version`'s.
    token_versions: list[int] = field(default_factory=list)
    text: str | None = None  # the answer as text, from an engine that returns text rather than our token ids
    usage_tokens: int | None = None  # tokens the answer took where `token_ids` does not say (a remote engine)
    error: str = ""
    # Asked with top_logprobs: per sampled token, the likeliest tokens of its distribution as (id, logprob).
    top_logprobs: list[list[tuple[int, float]]] | None = None
    # Asked with prompt_logprobs: per prompt token, None for the first (nothing precedes it), then
    # (its logprob, its rank in the distribution from 1, [(id, logprob)] of the likeliest alternatives).
    prompt_logprobs: list | None = None


def trim(tokens: list[int], logprobs: list[float], stop_ids: tuple[int, ...], max_new_tokens: int,
         top: list | None = None) -> Completion:
    """A completion cut right after its first stop id (`top`: its top_logprobs, cut alike)."""
    end, reason = max_new_tokens, "length"
    for index, token in enumerate(tokens):
        if token in stop_ids:
            end, reason = index + 1, "stop"
            break
    return Completion(tokens[:end], logprobs[:end], reason, top_logprobs=None if top is None else top[:end])


def _mark_swap(batch, version: int) -> None:
    """New weights (`version`) were just loaded under a running batch: where each live sample's tokens start being
    theirs. Its next token is still drawn from the logits the old weights computed after its last one (the batch
    samples before it runs the model), so the new weights' tokens start one further on. The keys and values
    cached for the earlier tokens stay the old weights' (recomputing them would cost a prefill per row per
    update); the logprobs recorded are those of the distribution that really drew each token either way."""
    for entry in batch.entries:
        entry.setdefault("swaps", []).append(([len(tokens) + 1 for tokens in entry["tokens"]], version))


def token_versions(length: int, version: int, swaps: list[tuple[int, int]]) -> list[int]:
    """Each of `length` tokens' version: `version` up to the first swap's position, then each swap's own."""
    versions = [version] * length
    for start, new in swaps:
        versions[start:] = [new] * max(0, length - start)
    return versions


class BatchingEngine:
    """The batching loop, the weight swap and the accounting; subclasses implement `_sample` and `_load`."""

    name = "engine"
    max_context: int | None = None  # the longest context the model takes (prompt + completion), if bounded
    # Samples from the trainer's own model rather than a copy (a sync run, where sampling and training take
    # turns): an update is in it already, so `load_weights` carries no state, only the new version.
    shares_weights = False

    def __init__(self, *, policy_version: int = 0, max_batch_rows: int = 512):
        self.policy_version = policy_version
        self.busy_seconds = 0.0
        # Speculative decoding's counts (speculation.py), in the engines that batch continuously and draft.
        self.speculation_stats = SpeculationStats()
        self.max_batch_rows = max_batch_rows
        self._queue: list[tuple[GenerationRequest, Future]] = []
        self._wakeup = threading.Condition()
        self._next_weights: tuple[dict, int] | None = None
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name=f"{self.name}-engine", daemon=True)
        self._thread.start()

    # --- what callers use ---------------------------------------------------------------------------------

    def generate(self, requests: list[GenerationRequest]) -> list[list[Completion]]:
        """One list of `request.n` completions per request."""
        return [future.result() for future in self.submit(requests)]

    def submit(self, requests: list[GenerationRequest]) -> list[Future]:
        """`generate` without waiting: a future per request (a server awaits them without a thread each)."""
        futures = [Future() for _ in requests]
        with self._wakeup:
            if self._closed:
                raise RuntimeError(f"the {self.name} engine is closed")
            self._queue += list(zip(requests, futures, strict=True))
            self._wakeup.notify()
        return futures

    def load_weights(self, state: dict | None, version: int) -> None:
        """The trainer's new weights (names as in the trainer's model), used from the next batch on; None for an
        engine that shares the trainer's model."""
        with self._wakeup:
            self._next_weights = (state, version)

    def close(self, timeout: float = 60.0) -> None:
        """Fails what is queued or sampling and frees the model; returns once the loop has done so (a step ends
        first). Waiting matters at exit: a loop still freeing its batch's tensors while the interpreter shuts down
        is killed inside a C++ destructor, and the process aborts ("terminate called without an active
        exception") after its work is done."""
        with self._wakeup:
            self._closed = True
            self._wakeup.notify()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout)
            if self._thread.is_alive():
                log.warning("the %s engine's loop did not stop within %.0f s of its close", self.name, timeout)

    # --- the loop -------------------------------------------------------------------------------------------

    def _loop(self) -> None:
        batch = self._open_batch()
        if batch is not None:
            return self._continuous_loop(batch)
        while True:
            with self._wakeup:
                while not self._queue and not self._closed:
                    self._wakeup.wait()
                if self._closed:
                    for _, future in self._queue:
                        future.set_exception(RuntimeError(f"the {self.name} engine is closed"))
                    self._release()
                    return
                taken, rows = [], 0
                while self._queue and (not taken or rows + self._queue[0][0].n <= self.max_batch_rows):
                    taken.append(self._queue.pop(0))
                    rows += taken[-1][0].n
                pending, self._next_weights = self._next_weights, None
            try:
                if pending is not None:
                    self._load(pending[0])
                    self.policy_version = pending[1]
                requests = [request for request, _ in taken]
                started = time.monotonic()
                results = self._sample(requests)
                seconds = time.monotonic() - started
            except Exception as exc:
                for _, future in taken:
                    future.set_exception(exc)
                continue
            self.busy_seconds += seconds
            # The batch's compute, shared by the tokens each completion sampled: its policy cost.
            total = max(1, sum(len(c.token_ids) for group in results for c in group))
            for (_, future), group in zip(taken, results, strict=True):
                for completion in group:
                    completion.compute_seconds = seconds * len(completion.token_ids) / total
                    completion.policy_version = self.policy_version
                future.set_result(group)

    def _continuous_loop(self, batch) -> None:
        """Requests join the running batch between two tokens and leave when done (sampling.ContinuousBatch).
        New weights are swapped in between two tokens too: the batch never drains, so waiting for it would
        starve the policy of updates. A completion is stamped with the version it started under (the oldest
        that wrote it) and carries the logprobs and the version of the weights that really sampled each token
        (`_mark_swap`): the trainer's importance ratio and its per-token staleness bound read them."""
        while True:
            with self._wakeup:
                while not self._queue and not len(batch) and not self._closed:
                    self._wakeup.wait()
                if self._closed:
                    for _, future in self._queue:
                        future.set_exception(RuntimeError(f"the {self.name} engine is closed"))
                    for entry in batch.entries:
                        entry["handle"][1].set_exception(RuntimeError(f"the {self.name} engine is closed"))
                    self._release()
                    return
                taken, room = [], self.max_batch_rows - len(batch)
                while self._queue and (not (taken or len(batch)) or self._queue[0][0].n <= room):
                    taken.append(self._queue.pop(0))
                    room -= taken[-1][0].n
                pending, self._next_weights = self._next_weights, None
            started = time.monotonic()
            try:
                if pending is not None:
                    self._load(pending[0])
                    self.policy_version = pending[1]
                    batch.weights_changed()
                    _mark_swap(batch, pending[1])
                if taken:
                    refused, scored = batch.admit([(self._sampling_request(request),
                                                    (request, future, self.policy_version))
                                                   for request, future in taken])
                    for (_, future, _), exc in refused:  # a prompt too long for the model: its caller's error
                        future.set_exception(exc)
                else:
                    scored = []
                finished = scored + (batch.advance() if len(batch) else [])
            except Exception as exc:  # the model failed: every caller in the batch hears it
                for entry in batch.entries:
                    entry["handle"][1].set_exception(exc)
                batch = self._open_batch()
                continue
            finally:
                self.busy_seconds += time.monotonic() - started
            for entry in finished:
                request, future, version = entry["handle"]
                group = []
                for sample, (tokens, logprobs, top, seconds) in enumerate(zip(
                        entry["tokens"], entry["logprobs"], entry["top"], entry["compute"], strict=True)):
                    completion = trim(tokens, logprobs, request.stop_ids, request.max_new_tokens,
                                      top if request.top_logprobs else None)
                    completion.compute_seconds, completion.policy_version = seconds, version
                    if "swaps" in entry:
                        completion.token_versions = token_versions(len(completion.token_ids), version,
                                                                   [(marks[sample], new) for marks, new in
                                                                    entry["swaps"]])
                    completion.prompt_logprobs = entry["prompt_logprobs"]
                    group.append(completion)
                future.set_result(group)

    # --- what an engine implements --------------------------------------------------------------------------

    def _open_batch(self):
        """A sampling.ContinuousBatch for engines that batch continuously; None for one batch at a time."""
        return None

    def _sampling_request(self, request: GenerationRequest):
        raise NotImplementedError

    def _sample(self, requests: list[GenerationRequest]) -> list[list[Completion]]:
        raise NotImplementedError

    def _load(self, state: dict) -> None:
        raise NotImplementedError

    def _release(self) -> None:
        """Free the model when the engine closes (called on the loop's thread)."""

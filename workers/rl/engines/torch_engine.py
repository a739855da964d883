"""The `torch` engine: the project's TinyLM sampling with its KV cache, on the CPU or a GPU.

With `batching` (async runs), requests from all rollout threads are sampled together: a generation loop takes
every request waiting, runs them as one batch (model.sample_batch: one forward pass per token for all rows,
finished rows dropped), and hands each caller its completions; requests that arrive meanwhile form the next
batch. Without it (sync runs), each request is sampled alone, so a fixed seed gives bit-identical samples
whatever else is running — what an exact resume needs.
"""

from __future__ import annotations

import copy
import threading
import time
from concurrent.futures import Future

import torch

from ..model import SamplingRequest, TinyLM, sample_batch
from . import Completion, GenerationRequest, stamp, trim


class TorchEngine:
    name = "torch"

    def __init__(self, model: TinyLM, *, device: str = "cpu", policy_version: int = 0, batching: bool = False,
                 max_batch_rows: int = 512):
        # Its own copy: the trainer updates its model while rollouts sample from this one.
        self.model = copy.deepcopy(model).to(device).eval()
        self.device = device
        self.policy_version = policy_version
        self.max_context = model.config.block_size
        self.busy_seconds = 0.0
        self.batching = batching
        self.max_batch_rows = max_batch_rows
        self._weights = threading.Lock()  # held while sampling and while loading weights
        self._queue: list[tuple[GenerationRequest, Future]] = []
        self._wakeup = threading.Condition()
        self._closed = False
        self._next_weights: tuple[dict, int] | None = None
        if batching:
            threading.Thread(target=self._loop, name="torch-engine", daemon=True).start()

    def generate(self, requests: list[GenerationRequest]) -> list[list[Completion]]:
        if not self.batching:
            return self._sample(requests)
        futures = [Future() for _ in requests]
        with self._wakeup:
            if self._closed:
                raise RuntimeError("the engine is closed")
            self._queue += list(zip(requests, futures, strict=True))
            self._wakeup.notify()
        return [future.result() for future in futures]

    def _loop(self) -> None:
        while True:
            with self._wakeup:
                while not self._queue and not self._closed:
                    self._wakeup.wait()
                if self._closed:
                    for _, future in self._queue:
                        future.set_exception(RuntimeError("the engine is closed"))
                    return
                taken, rows = [], 0
                while self._queue and (not taken or rows + self._queue[0][0].n <= self.max_batch_rows):
                    taken.append(self._queue.pop(0))
                    rows += taken[-1][0].n
            self._swap_in_new_weights()
            try:
                results = self._sample([request for request, _ in taken])
            except Exception as exc:
                for _, future in taken:
                    future.set_exception(exc)
                continue
            for (_, future), result in zip(taken, results, strict=True):
                future.set_result(result)

    def _sample(self, requests: list[GenerationRequest]) -> list[list[Completion]]:
        batch = []
        for request in requests:
            room = self.max_context - len(request.prompt_ids)
            if room < 1:
                raise ValueError(f"prompt of {len(request.prompt_ids)} tokens leaves no room in a context of "
                                 f"{self.max_context}")
            generator = None
            if request.seed is not None:
                generator = torch.Generator(device=self.device).manual_seed(request.seed)
            batch.append(SamplingRequest(request.prompt_ids, request.n, min(request.max_new_tokens, room),
                                         tuple(request.stop_ids), request.temperature, generator))
        with self._weights:
            started = time.monotonic()
            if self.batching:
                sampled = sample_batch(self.model, batch)
            else:  # one request at a time: its numerics never depend on its neighbours
                sampled = [sample_batch(self.model, [one])[0] for one in batch]
            seconds = time.monotonic() - started
            self.busy_seconds += seconds
            version = self.policy_version
        return stamp([[trim(tokens, logprobs, request.stop_ids, request.max_new_tokens) for tokens, logprobs in rows]
                      for request, rows in zip(requests, sampled, strict=True)], seconds=seconds, policy_version=version)

    def load_weights(self, state: dict, version: int) -> None:
        """Batching: the new weights wait beside the model and are swapped in between two batches, so the
        trainer never waits for a batch of long samples to finish. Otherwise they are loaded at once."""
        if self.batching:
            with self._wakeup:
                self._next_weights = (state, version)
            return
        with self._weights:
            self.model.load_state_dict(state)
            self.policy_version = version

    def _swap_in_new_weights(self) -> None:
        with self._wakeup:
            pending, self._next_weights = self._next_weights, None
        if pending is not None:
            with self._weights:
                self.model.load_state_dict(pending[0])
                self.policy_version = pending[1]

    def close(self) -> None:
        with self._wakeup:
            self._closed = True
            self._wakeup.notify()

"""CUDA graphs of the continuous batch's decode step: the step's few hundred kernels (a 30-layer model's forward
pass) recorded once per shape and launched again as one graph, since a small model's decode step on a GPU is
bound by launching kernels, not by computing them (issue 27: ~25 ms a step against ~0.1 ms of memory traffic).

A recorded graph replays fixed kernels on fixed addresses, so a step's shape must come from a small set: the
rows are padded up to a bucket (ROW_BUCKETS; the padding rows are free slots of the SlotCache, which attend
their column 0 and are never read) and the columns are the cache's multiples of COLUMN_STEP. Per (rows, columns)
one graph, recorded the first time that shape is met and kept while the cache's buffers are the same allocation
(SlotCache.version). What the step reads lives at fixed addresses: the tokens in this module's input buffer, the
positions and the mask in the SlotCache's per-shape set-up, the keys and values in its buffers, the weights where
the model holds them — every weight update the engines make is in place (load_state_dict copies into the
parameters; a shared model's optimizer steps in place), which a replay then reads.

Recording runs the step twice (once eagerly on a side stream, as torch's documentation asks, then under
capture). Running a decode step again is harmless: it writes the same keys into the same columns and the cache
advances only afterwards (SlotCache.advance), so the replay that follows computes exactly the step.

vLLM does the same for its decode (CUDA graphs over padded batch sizes, one shared memory pool); this one is
written for the studio's own cache layout. A recording synchronizes the device and empties torch's cache of
free blocks (torch.cuda.graph does): a run meets its shapes in its first steps and replays them afterwards, and a
drained batch keeps its cache (sampling.KEPT_RECORDED_CACHE_BYTES) so that its graphs stay valid for the next
step. Where recording fails (a model whose forward pass reads a value back from the device, say) the batch says
why in `disabled` and decodes eagerly from then on: slower, still right. On a CPU there is nothing to record:
there a DecodeGraphs pads the rows as a graph would and runs the step eagerly, which is what the CPU tests hold
to the unpadded decode."""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch

logger = logging.getLogger(__name__)

# The rows a recorded step is made for (vLLM's own choice: 1, 2, 4, then multiples of 8); more rows than the
# last bucket decode eagerly, where launching is a smaller share of the step anyway.
ROW_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320, 384, 448, 512)
KEPT_GRAPHS = 96  # recorded shapes kept: rows buckets x column multiples met; past it, all are dropped at once


def for_device(device, enabled: bool | None = None) -> DecodeGraphs | None:
    """An engine's DecodeGraphs where `enabled` (None: wherever the device is CUDA), else None (eager steps)."""
    if enabled is None:
        enabled = torch.device(device).type == "cuda"
    return DecodeGraphs(device) if enabled else None


class DecodeGraphs:
    def __init__(self, device, *, record: bool = True):
        """On a CUDA device steps are recorded and replayed; on any other (or with `record` False) the rows are
        padded as for a graph and the step runs eagerly: what the CPU tests and the GPU check's dry run exercise,
        and what the GPU check holds the replays to."""
        self.device = torch.device(device)
        self.capture = record and self.device.type == "cuda"
        self.graphs: dict[tuple[int, int], tuple] = {}  # (rows, columns) -> graph, its tokens buffer
        # Every graph writes its logits into this one buffer (made at the first recording, outside the graphs'
        # memory pool, for the last bucket's rows): kept per graph, logits of rows x vocabulary would add up to
        # gigabytes over the shapes a run meets.
        self.output: torch.Tensor | None = None
        self.stream = torch.cuda.Stream(self.device) if self.capture else None  # graphs sharing a pool: one stream
        self.pool = None  # the graphs' shared memory pool, new whenever all graphs are dropped
        self.version = None  # the SlotCache allocation the graphs were recorded against
        self.disabled: str | None = None  # why recording failed, after which every step runs eagerly
        self.recorded = self.replays = self.eager_steps = 0

    def rows(self, used: int) -> int:
        """The rows a step over `used` slots runs: its bucket, or `used` itself when it runs eagerly."""
        if self.disabled is not None or used > ROW_BUCKETS[-1]:
            return used
        return next(bucket for bucket in ROW_BUCKETS if bucket >= used)

    def drop(self) -> None:
        """Forget every recorded graph. All at once, never one by one: graphs recorded on one stream share what
        cuBLAS keeps for that stream, which destroying one graph may free under the others (pytorch#193402)."""
        self.graphs.clear()
        self.pool = None

    def decode(self, decode_step: Callable, tokens: torch.Tensor, used: int, cache, mask: torch.Tensor,
               positions: torch.Tensor) -> torch.Tensor:
        """One decode step over the first `used` slots' `tokens` (at least `used` of them), at the shape
        `cache.prepare` set up (`mask` (rows, 1, 1, W), rows from `self.rows(used)`). Returns the last logits of
        the `used` rows, a tensor of their own (the next replay overwrites the graphs' output)."""
        rows = mask.shape[0]
        if not self.capture or self.disabled is not None or used > ROW_BUCKETS[-1]:
            return self._eager(decode_step, tokens, used, rows, cache, mask, positions)
        if cache.version != self.version:
            self.drop()
            self.version = cache.version
        key = (rows, mask.shape[-1])
        entry = self.graphs.get(key)
        if entry is None:
            if len(self.graphs) >= KEPT_GRAPHS:
                self.drop()
            stream = torch.cuda.current_stream(self.device)
            try:
                entry = self.graphs[key] = self._record(decode_step, tokens, used, rows, cache, mask, positions)
            except Exception as error:  # noqa: BLE001 — a model that cannot be recorded still decodes, eagerly
                # A failed capture leaves the side stream current (torch's graph context ends the capture before
                # it restores the stream): the engine's work must go back to the stream it ran on.
                torch.cuda.set_stream(stream)
                self.disabled = f"{type(error).__name__}: {error}"[:300]
                self.drop()
                logger.warning("decoding without CUDA graphs: recording a step failed (%s)", self.disabled)
                return self._eager(decode_step, tokens, used, rows, cache, mask, positions)
        graph, inputs = entry
        inputs[:used, 0].copy_(tokens[:used])
        graph.replay()
        self.replays += 1
        return self.output[:used].clone()

    def _eager(self, decode_step, tokens, used, rows, cache, mask, positions) -> torch.Tensor:
        """The step run as it is, over `rows`: when those were padded for a graph, the padding rows (free slots)
        decode token 0 harmlessly and their logits are dropped."""
        self.eager_steps += 1
        if rows == used:
            return decode_step(tokens[:used, None], positions, cache, mask)
        padded = tokens.new_zeros(rows, 1)
        padded[:used, 0] = tokens[:used]
        return decode_step(padded, positions, cache, mask)[:used]

    def _record(self, decode_step, tokens, used, rows, cache, mask, positions) -> tuple:
        inputs = torch.zeros(rows, 1, dtype=torch.long, device=self.device)
        inputs[:used, 0].copy_(tokens[:used])
        # A first run outside the graph on the side stream: lazy initialisations (cuBLAS handles and workspaces,
        # attention kernels' choices) must not happen under capture.
        current = torch.cuda.current_stream(self.device)
        self.stream.wait_stream(current)
        with torch.cuda.stream(self.stream):
            logits = decode_step(inputs, positions, cache, mask)
        current.wait_stream(self.stream)
        if self.output is None:
            self.output = logits.new_empty(ROW_BUCKETS[-1], logits.shape[-1])
        del logits
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        # thread_local: a trainer working on the same GPU from another thread (an async run) does not break the
        # capture, as the default global mode would make it.
        with torch.cuda.graph(graph, pool=self.pool, stream=self.stream, capture_error_mode="thread_local"):
            self.output[:rows].copy_(decode_step(inputs, positions, cache, mask))
        self.recorded += 1
        return graph, inputs

    def stats(self) -> dict:
        return {"recorded": self.recorded, "kept": len(self.graphs), "replays": self.replays,
                "eager_steps": self.eager_steps, "disabled": self.disabled}

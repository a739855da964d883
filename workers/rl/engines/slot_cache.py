"""The running batch's KV cache: per layer, keys and values in buffers (slots, kv heads, columns, head dim),
allocated ahead and indexed by slot, so what a decode step launches does not depend on how many rows sample.

A row owns a slot from its admission to its last token. Its prompt's keys and values (computed once per prompt,
however many samples share it) are written into the slot's first columns, left-aligned: column c holds position
c, so the row's next token is written at column `lengths[slot]` and attends columns 0..lengths[slot]. A decode
step runs over the first `rows` slots (admission hands out the lowest free slots; ContinuousBatch moves rows down
when many low ones are free), writes every row's new keys with one scatter per layer and attends the first
`width` columns under one mask. A finished row frees its slot; nothing is selected, concatenated or merged per
step, as the previous cache (per-row select and merge, a copy of the cache whenever rows came or went) did. The
buffers grow by doubling, in slots or in columns, when an admission needs more: a copy per doubling, not per token.

The model's attention calls `update(keys, values, layer)` for the step — the method transformers' attention calls
on its Cache (its other keyword arguments ignored) and the one the project's TinyLM calls."""

from __future__ import annotations

import itertools

import torch

COLUMN_STEP = 64  # a decode step attends a multiple of this many columns: its views last that many tokens
KEPT_STEPS = 256  # the decode-step set-ups (views, mask buffer) a cache keeps, one per (rows, columns) it met
_versions = itertools.count()  # tells a cache's buffers from every earlier allocation's, in any cache


def _doubled(size: int, needed: int) -> int:
    while size < needed:
        size *= 2
    return size


class SlotCache:
    def __init__(self, layers: int, heads: int, dim: int, *, dtype, device, slots: int = 8, columns: int = 64):
        self.keys = [torch.zeros(slots, heads, columns, dim, dtype=dtype, device=device) for _ in range(layers)]
        self.values = [torch.zeros_like(buffer) for buffer in self.keys]
        self.lengths = torch.zeros(slots, dtype=torch.long, device=device)  # tokens each slot holds
        self.live = torch.zeros(slots, dtype=torch.long, device=device)  # 1 where a row is sampling
        self.device = device
        self._columns = torch.arange(columns, device=device)
        # Changes whenever the buffers are allocated anew: what was recorded against the old ones (a CUDA graph of
        # a decode step, engines/decode_graphs.py) must not be replayed.
        self.version = next(_versions)
        # (rows, columns) -> a decode step's views and mask buffer. Kept, not remade when the shape changes: a
        # recorded step reads its mask where it was when recorded.
        self._steps: dict[tuple[int, int], dict] = {}
        self._step: dict | None = None  # the one `prepare` set up last, which `update` and `advance` use

    @property
    def slots(self) -> int:
        return self.keys[0].shape[0]

    @property
    def columns(self) -> int:
        return self.keys[0].shape[2]

    @property
    def bytes(self) -> int:
        """What the keys and values buffers hold, in bytes."""
        return sum(buffer.nbytes for buffers in (self.keys, self.values) for buffer in buffers)

    def reserve(self, slots: int, columns: int) -> None:
        """Room for `slots` slots of `columns` columns: the buffers double until they fit (contents kept)."""
        new_slots, new_columns = _doubled(self.slots, slots), _doubled(self.columns, columns)
        if (new_slots, new_columns) == (self.slots, self.columns):
            return
        for buffers in (self.keys, self.values):
            for layer, old in enumerate(buffers):
                grown = old.new_zeros(new_slots, old.shape[1], new_columns, old.shape[3])
                grown[:old.shape[0], :, :old.shape[2]] = old
                buffers[layer] = grown
        self.lengths = torch.cat([self.lengths, self.lengths.new_zeros(new_slots - len(self.lengths))])
        self.live = torch.cat([self.live, self.live.new_zeros(new_slots - len(self.live))])
        self._columns = torch.arange(new_columns, device=self.device)
        self._steps, self._step, self.version = {}, None, next(_versions)

    def write(self, slots: torch.Tensor, layers: list, pads: torch.Tensor | None, lengths: torch.Tensor,
              owners: torch.Tensor | None = None, *, start: int = 0) -> None:
        """A prefill's keys and values into `slots`: `layers` [(keys, values)], each (prompts, heads, W, dim) and
        padded by `pads` (prompts,) at column `start` (0: left-padded; a prompt continuing a kept prefix of `start`
        tokens is padded after it), or None when no prompt is padded; slot i takes prompt owners[i] (a prompt
        shared by n samples is computed once and written n times), `lengths` (slots,) its prompt's length. Columns
        past a row's length receive another column's values: masked, and overwritten as the row grows.

        Each prompt is aligned once (not once per sample), then copied into its samples' slots; when nothing is
        padded an admission is one copy per buffer. That matters on a CPU, where each small operation costs tens of
        microseconds whatever its size: aligned per sample, the writes took 13 ms of the tiny workload's GRPO step."""
        width = layers[0][0].shape[2]  # the caller reserved room for it
        index = None
        if pads is not None:
            columns = self._columns[None, :width]
            shift = pads[:, None] if start == 0 else pads[:, None] * (columns >= start)
            source = (columns + shift).clamp(max=width - 1)  # (prompts, W)
            keys = layers[0][0]
            index = source[:, None, :, None].expand(-1, keys.shape[1], -1, keys.shape[3])
        for layer, pair in enumerate(layers):
            for buffer, written in zip((self.keys[layer], self.values[layer]), pair, strict=True):
                if index is not None:
                    written = written.gather(2, index)
                if owners is not None:
                    written = (written.expand(len(owners), -1, -1, -1) if written.shape[0] == 1
                               else written.index_select(0, owners))
                buffer[:, :, :width].index_copy_(0, slots, written.to(buffer.dtype))
        self.lengths.index_copy_(0, slots, lengths)
        self.live.index_fill_(0, slots, 1)

    def free(self, slots: torch.Tensor) -> None:
        """These slots' rows have stopped: they hold nothing (a free slot attends its column 0, never read)."""
        self.lengths.index_fill_(0, slots, 0)
        self.live.index_fill_(0, slots, 0)

    def move(self, sources: torch.Tensor, targets: torch.Tensor) -> None:
        """Rows at `sources` to slots `targets` (free ones): the batch packs itself into its lowest slots."""
        for buffers in (self.keys, self.values):
            for buffer in buffers:
                buffer.index_copy_(0, targets, buffer.index_select(0, sources))
        for state in (self.lengths, self.live):
            state.index_copy_(0, targets, state.index_select(0, sources))
        self.free(sources)

    def prepare(self, rows: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Set up a decode step over slots [0, rows) attending at least columns [0, width): each row writes its
        token at column lengths[slot], its position. Returns the attention mask (rows, 1, 1, W), additive in the
        cache's dtype, and the positions (rows, 1). W is `width` rounded up to a multiple of COLUMN_STEP: the
        views, the write index and the mask buffer are made once per (rows, W) and kept with the buffers — a
        step then adds two scatters per layer and two small operations to the model's forward pass, whatever
        the rows, and a step recorded at that shape finds its tensors where they were."""
        span = min(self.columns, -(-width // COLUMN_STEP) * COLUMN_STEP)
        if width > span:
            raise ValueError(f"a decode step of {width} columns in a cache of {self.columns}")
        step = self._steps.get((rows, span))
        if step is None:
            if len(self._steps) >= KEPT_STEPS:  # their mask buffers go: nothing recorded against them may replay
                self._steps.clear()
                self.version = next(_versions)
            heads, dim = self.keys[0].shape[1], self.keys[0].shape[3]
            written = self.lengths[:rows]
            dtype = self.keys[0].dtype
            step = self._steps[(rows, span)] = {
                "written": written, "live": self.live[:rows],
                "index": written.view(rows, 1, 1, 1).expand(rows, heads, 1, dim),
                "positions": written.view(rows, 1), "columns": self._columns[:span],
                "layers": [(keys[:rows], values[:rows], keys[:rows, :, :span], values[:rows, :, :span])
                           for keys, values in zip(self.keys, self.values, strict=True)],
                # Additive (0 where attended, the dtype's minimum elsewhere): a boolean mask would be converted
                # in every layer's attention.
                "allowed": torch.empty(rows, 1, 1, span, dtype=torch.bool, device=self.device),
                "mask": torch.empty(rows, 1, 1, span, dtype=dtype, device=self.device),
                "attended": torch.tensor(0.0, dtype=dtype, device=self.device),
                "masked": torch.tensor(torch.finfo(dtype).min, dtype=dtype, device=self.device)}
        self._step = step
        torch.le(step["columns"], step["written"].view(rows, 1, 1, 1), out=step["allowed"])
        torch.where(step["allowed"], step["attended"], step["masked"], out=step["mask"])
        return step["mask"], step["positions"]

    def prepare_span(self, rows: int, width: int, span: int, *, limit: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Set up a step of `span` tokens per row over slots [0, rows) (speculative decoding's verification: a
        row's sampled token and its drafts, engines/speculation.py): token j of a row is written at column
        lengths[slot] + j and attends columns up to its own. `width`: the columns the widest row reaches, its last
        token's included (the caller reserved them). Returns the mask (rows, 1, span, W), additive, and the
        positions (rows, span), cut at `limit` - 1 (the padding of a row with fewer drafts may run past the
        model's context; what it computes there is never read). Not kept per shape as `prepare`'s are: these steps
        run eagerly, never recorded."""
        span_columns = min(self.columns, -(-width // COLUMN_STEP) * COLUMN_STEP)
        if width > span_columns:
            raise ValueError(f"a step of {width} columns in a cache of {self.columns}")
        written = self.lengths[:rows]
        columns = written[:, None] + torch.arange(span, device=self.device)[None, :]  # (rows, span)
        heads, dim = self.keys[0].shape[1], self.keys[0].shape[3]
        dtype = self.keys[0].dtype
        allowed = self._columns[:span_columns].view(1, 1, 1, -1) <= columns.view(rows, 1, span, 1)
        mask = torch.where(allowed, torch.tensor(0.0, dtype=dtype, device=self.device),
                           torch.tensor(torch.finfo(dtype).min, dtype=dtype, device=self.device))
        self._step = {"written": written, "live": self.live[:rows],
                      "index": columns.view(rows, 1, span, 1).expand(rows, heads, span, dim),
                      "layers": [(keys[:rows], values[:rows], keys[:rows, :, :span_columns],
                                  values[:rows, :, :span_columns])
                                 for keys, values in zip(self.keys, self.values, strict=True)]}
        return mask, columns.clamp(max=limit - 1)

    def advance_by(self, counts: torch.Tensor) -> None:
        """After a `prepare_span` step: each row keeps the first counts[slot] of the tokens it wrote (its sampled
        token and the drafts accepted); the columns of rejected drafts are past its length, masked from then on
        and overwritten as it grows. This is the rollback of the cache: nothing is copied or erased."""
        self._step["written"].add_(counts * self._step["live"])

    def update(self, keys: torch.Tensor, values: torch.Tensor, layer: int, *_, **__):
        """This step's keys and values (rows, heads, 1 or a span's tokens, dim) written at each row's columns;
        returns the layer's keys and values (rows, heads, W, dim) to attend."""
        key_buffer, value_buffer, attended_keys, attended_values = self._step["layers"][layer]
        index = self._step["index"]
        key_buffer.scatter_(2, index, keys)
        value_buffer.scatter_(2, index, values)
        return attended_keys, attended_values

    def advance(self) -> None:
        """After a decode step: every sampling row holds one more token."""
        self._step["written"].add_(self._step["live"])

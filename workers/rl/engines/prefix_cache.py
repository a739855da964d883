"""Prompts' keys and values kept after their prefill, so that a later prompt beginning with the same tokens computes
only its own rest: what vLLM calls automatic prefix caching, for the engines here.

A multi-turn rollout is where it pays. Its second turn's prompt is its first turn's prompt, the model's tool call
and the tool's result; each of a GRPO group's rows asks separately, since their calls differ, so without this
each prefilled the whole conversation again. Measured on demo-smollm's tool template after its SFT cold start
(2 cores, SmolLM2-135M): a 307-token first prompt, and the second turn of its 8 rows, two or three tokens each
("4897"), took 14 s of a 24 s rollout, while the first turn's 40 tokens took 9.5 s. With the prompt kept, the
second turn prefills the ~60 tokens each row added. Turn k's prompt is kept too, so turn k + 1 of an agent's
loop prefills only what the model and its tools added since.

Kept entries are exact: a key and value at position c depend on the tokens 0..c alone, so any common prefix of
a kept prompt and a new one is reusable, whatever follows. They hold for one set of weights: the engine clears
them when new weights arrive. Least recently used entries leave first, past a byte budget; a prompt that extends
a kept one replaces it (any prompt the shorter one could serve, the longer one serves as well).
"""

from __future__ import annotations

from collections import OrderedDict

import torch

MIN_SHARED_TOKENS = 16  # a shorter common prefix is not worth a prefill of its own
PREFIX_CACHE_BYTES = 256 << 20

Layers = list[tuple[torch.Tensor, torch.Tensor]]  # per layer (keys, values), each (1, kv heads, tokens, head dim)


def common_length(a: list[int] | tuple[int, ...], b: tuple[int, ...]) -> int:
    """How many leading tokens a and b share: a binary search over slice comparisons, which run in C."""
    low, high = 0, min(len(a), len(b))
    while low < high:
        middle = (low + high + 1) // 2
        if tuple(a[:middle]) == b[:middle]:
            low = middle
        else:
            high = middle - 1
    return low


def layers_bytes(layers: Layers) -> int:
    return sum(keys.nbytes + values.nbytes for keys, values in layers)


class PrefixCache:
    def __init__(self, budget_bytes: int = PREFIX_CACHE_BYTES):
        self.budget_bytes = budget_bytes
        self.entries: OrderedDict[tuple[int, ...], Layers] = OrderedDict()
        self.bytes = 0

    def __len__(self) -> int:
        return len(self.entries)

    def longest(self, prompt: list[int]) -> tuple[int, Layers | None]:
        """The longest kept prefix of `prompt` worth reusing — short of its last token, whose logits the prefill
        must compute — as (its length, the kept layers, of which the first `length` columns apply); (0, None)
        when none is."""
        best, layers, best_key = 0, None, None
        for key, kept in self.entries.items():
            length = min(common_length(prompt, key), len(prompt) - 1)
            if length > best:
                best, layers, best_key = length, kept, key
        if best < MIN_SHARED_TOKENS:
            return 0, None
        self.entries.move_to_end(best_key)
        return best, layers

    @staticmethod
    def worth_keeping(prompt: list[int]) -> bool:
        """Whether `add` would keep `prompt` (asked before its keys and values are copied out of a batch)."""
        return len(prompt) >= MIN_SHARED_TOKENS

    def add(self, prompt: list[int], layers: Layers) -> None:
        """Keep `layers`, the keys and values of every token of `prompt` (owned tensors, not views of a batch)."""
        size = layers_bytes(layers)
        if size > self.budget_bytes or not self.worth_keeping(prompt):
            return
        key = tuple(prompt)
        for kept in [kept for kept in self.entries if len(kept) <= len(key) and key[:len(kept)] == kept]:
            self.bytes -= layers_bytes(self.entries.pop(kept))
        self.entries[key] = layers
        self.bytes += size
        while self.bytes > self.budget_bytes:
            _, evicted = self.entries.popitem(last=False)
            self.bytes -= layers_bytes(evicted)

    def clear(self) -> None:
        self.entries.clear()
        self.bytes = 0

"""Speculative decoding from the context (prompt lookup, vLLM's `ngram` method, transformers'
`prompt_lookup_num_tokens`): a row whose last tokens occurred earlier in its sequence (the prompt with its tool
results, and what it has written) is offered the tokens that followed them there as drafts, and one forward pass
over its sampled token and the drafts verifies them all. An agent copying back the lines it viewed (a
`str_replace`'s old_str, a test's name) then writes several tokens per forward pass instead of one.

The drafts are checked by sampling from the model's own distribution, so the output is what plain decoding gives:
- greedy (temperature 0): a draft is kept while it is the most likely token; the first one that is not is
  replaced by the most likely, so the tokens are those of plain greedy decoding;
- sampled: the draft distribution of a lookup is a point mass on the draft d, so speculative sampling (Leviathan
  et al. 2023; Chen et al. 2023) keeps d with probability p(d) and, at the first draft refused, samples from p with
  d removed and renormalised — each token is distributed as p, given the ones before. The logprob recorded for
  every token is the target model's log p(token), which is what the trainer recomputes.

ContinuousBatch (sampling.py) does the verifying: the forward pass over a row's tokens writes them all into its
slot cache, and the row keeps those of its sampled token and the accepted drafts (SlotCache.advance_by); the
rejected ones' columns are past its length, so nothing is rolled back by copying. The refused draft's residual
sampling happens at the row's next step, from the logits the verifying pass already computed for that position.

The lookup (`NgramIndex`): the longest n-gram from `max_ngram` down to `min_ngram` ending the sequence, at its
latest earlier occurrence — an agent copies what it viewed last (vLLM takes the earliest; a trajectory viewing a
file twice, before and after an edit, wants the latest). Each prompt's n-grams are indexed once per request (the
samples of a GRPO group share it) and a row's own as it writes them, so a lookup is a few dictionary reads, not a
scan of the context (vLLM's KMP scan is numba-compiled; in Python, an index is what keeps a step's cost flat).

Off by default (RolloutConfig.speculative_tokens 0), from `bench engine`'s measurements on 2 shared CPU cores
(SmolLM2-135M, fp32, temperature 1, 64 tokens; the repository workload's 16 prompts of ~1,040 tokens). Verifying
steps first cost ~3.6x a plain one and the repository workload ran at 0.22-0.45x: transformers copied each layer's
keys and values once per query head for a step of several tokens a row, 2.4 GB a step at 16 rows
(grouped_attention.py). Attended in place, 18.5 tokens/s with it against 24.5 without (0.76x; before, in the same
conditions, 5.3 against 24.1: with speculation 3.5x faster), acceptance 0.61. What is left is arithmetic: on
these cores a step's matrix products cost in proportion to the tokens in it at any batch (one 576x1536
projection: 0.15 ms for 1 row, 2.2 ms for 16, 8.1 ms for 80), so a verified draft costs about what a sampled
token does and a refused one is lost; the first 4 prompts alone measured no better (0.68x). Where a step is bound by
reading the weights (a GPU at small batches, once verifying steps are recorded as CUDA graphs as decode steps
are) it should pay; that is not measured yet.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Speculation:
    """How the engines that batch continuously draft from the context. `tokens` 0 turns it off."""

    tokens: int = 4  # drafts verified per row and step (vLLM's num_speculative_tokens)
    min_ngram: int = 2  # the shortest ending of the sequence looked up (vLLM's prompt_lookup_min)
    max_ngram: int = 4  # the longest (prompt_lookup_max)
    # Above this many rows a step decodes plainly (vLLM's disable_by_batch_size): there the forward pass is bound
    # by computing, and a row's drafts cost every row the same widening.
    max_rows: int = 64

    @property
    def enabled(self) -> bool:
        return self.tokens > 0


OFF = Speculation(tokens=0)


@dataclass
class SpeculationStats:
    """What speculation did in an engine: forward passes that verified drafts, tokens drafted and accepted."""

    steps: int = 0
    drafted: int = 0
    accepted: int = 0

    def as_dict(self) -> dict:
        return {"verify_steps": self.steps, "drafted_tokens": self.drafted, "accepted_tokens": self.accepted,
                "acceptance_rate": round(self.accepted / self.drafted, 4) if self.drafted else None}


class NgramIndex:
    """n-gram (a tuple of `min_ngram` to `max_ngram` ids) -> the position of its last token, at its latest
    occurrence among the positions indexed so far (a prefix of one sequence)."""

    def __init__(self, min_ngram: int, max_ngram: int, start: int = 0):
        self.min_ngram, self.max_ngram = min_ngram, max_ngram
        self.ends: dict[tuple[int, ...], int] = {}
        self.indexed = start  # n-grams ending before this position are in `ends` (or in a shared index)

    def extend(self, sequence: list[int], upto: int) -> None:
        """Index the n-grams of `sequence` ending at positions [indexed, upto)."""
        low, high, ends = self.min_ngram, self.max_ngram, self.ends
        for end in range(max(self.indexed, low - 1), upto):
            for n in range(low, min(high, end + 1) + 1):
                ends[tuple(sequence[end - n + 1:end + 1])] = end
        self.indexed = max(self.indexed, upto)


def propose(sequence: list[int], own: NgramIndex, shared: NgramIndex | None, count: int) -> list[int]:
    """Up to `count` drafts for `sequence`: what followed the longest n-gram ending it, at that n-gram's latest
    earlier occurrence. `own` indexes the sequence from some position on (brought up to all but its last token
    here); `shared` the positions before that (a request's prompt, shared by its samples)."""
    length = len(sequence)
    own.extend(sequence, length - 1)  # an n-gram ending at the last token would find itself
    for n in range(min(own.max_ngram, length - 1), own.min_ngram - 1, -1):
        key = tuple(sequence[length - n:])
        end = own.ends.get(key)
        if end is None and shared is not None:
            end = shared.ends.get(key)
        if end is not None:
            return sequence[end + 1:end + 1 + count]
    return []

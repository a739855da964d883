"""Multiple choice by loglikelihood: the choice the model finds likeliest after the prompt, scored as
lm-evaluation-harness scores its `multiple_choice` tasks (the sum of the continuation's token logprobs given the
context, no length normalisation: its `acc`).

The logprobs come from the policy's own forward pass, the one the trainer takes (`policy.logprobs`), at
temperature 1 — not from an engine's sampling — so a served model's answers can be checked against it: what
lm-evaluation-harness chooses through `serve`'s prompt logprobs is what the model itself prefers.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Choice:
    index: int  # the likeliest continuation
    logprobs: list[float]  # each continuation's summed logprob given the context


@torch.no_grad()
def continuation_logprobs(policy, context_ids: list[int], continuations: list[list[int]]) -> list[float]:
    """log p(continuation | context) for each continuation, one forward pass each (a context of one token at
    least: the first token has nothing to be predicted from)."""
    if not context_ids:
        raise ValueError("the context needs a token: the first token of a sequence has no logprob")
    out = []
    for continuation in continuations:
        if not continuation:
            raise ValueError("a continuation needs a token")
        ids = torch.tensor([context_ids + continuation], dtype=torch.long, device=getattr(policy, "device", "cpu"))
        scored = policy.logprobs(ids, torch.ones_like(ids), 1.0, first=len(context_ids) - 1)
        logprobs = scored[0] if isinstance(scored, tuple) else scored
        out.append(float(logprobs[0, :len(continuation)].sum()))
    return out


def choose(policy, context_ids: list[int], continuations: list[list[int]]) -> Choice:
    """The likeliest continuation (the first of equals, as the harness's argmax) and every continuation's logprob."""
    logprobs = continuation_logprobs(policy, context_ids, continuations)
    return Choice(max(range(len(logprobs)), key=logprobs.__getitem__), logprobs)

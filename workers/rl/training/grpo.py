"""GRPO and its common variants, as one loss over groups of sampled completions.

- Advantages are group-relative: each completion's reward minus its group's mean, divided by the group's
  std when `normalize_std` (Dr. GRPO leaves that out). A group whose rewards are all equal carries no
  learning signal: its advantages are zero and it is counted as not effective.
- The policy ratio is clipped PPO-style with a higher upper clip (`clip_high` > `clip_low`, as in DAPO), so
  unlikely-but-good tokens can still gain probability.
- The loss is aggregated per token over the whole batch (long completions are not down-weighted per token).
- An optional KL penalty to a reference policy uses the k3 estimator, exp(ref - new) - (ref - new) - 1.
"""

from __future__ import annotations

import torch

from ..config import GRPOConfig  # the loss reads its clip_low, clip_high and kl_coef


def group_advantages(rewards: torch.Tensor, *, normalize_std: bool = True, eps: float = 1e-6):
    """rewards (groups, G) -> advantages (groups, G) and which groups are effective (groups,)."""
    centred = rewards - rewards.mean(dim=1, keepdim=True)
    spread = rewards.std(dim=1, keepdim=True, unbiased=False)
    effective = spread.squeeze(1) > eps
    advantages = centred / (spread + eps) if normalize_std else centred
    return torch.where(effective.unsqueeze(1), advantages, torch.zeros_like(advantages)), effective


def grpo_loss(new_logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor,
              mask: torch.Tensor, config: GRPOConfig, ref_logprobs: torch.Tensor | None = None,
              token_count: int | None = None):
    """All tensors (N, T) per token except advantages (N,). Returns the loss and its statistics.

    token_count: the tokens of the whole batch when this is one micro-batch of it, so that the micro-batches'
    losses add up to the batch's token-level mean (gradient accumulation without re-weighting)."""
    loss, sums = grpo_terms(new_logprobs, old_logprobs, advantages, mask, config, ref_logprobs=ref_logprobs,
                            token_count=token_count)
    kl_sum, clipped, tokens = sums.tolist()
    tokens = max(tokens, 1.0)
    return loss, {"loss": loss.item(), "kl": kl_sum / tokens, "clip_fraction": clipped / tokens,
                  "tokens": int(tokens)}


def grpo_terms(new_logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor,
               mask: torch.Tensor, config: GRPOConfig, ref_logprobs: torch.Tensor | None = None,
               token_count: int | None = None):
    """grpo_loss's arithmetic with its statistics left on the loss's device, so a trainer reads them once a step
    rather than waiting for the device after every micro-batch: the loss and the (3,) fp32 sums (KL over the
    masked tokens, clipped masked tokens, masked tokens)."""
    ratio = torch.exp(new_logprobs - old_logprobs)
    advantage = advantages.unsqueeze(1)
    unclipped = ratio * advantage
    clipped = torch.clamp(ratio, 1 - config.clip_low, 1 + config.clip_high) * advantage
    per_token = -torch.minimum(unclipped, clipped)
    if ref_logprobs is not None and config.kl_coef > 0:
        delta = ref_logprobs - new_logprobs
        kl = torch.exp(delta) - delta - 1
        per_token = per_token + config.kl_coef * kl
    else:
        kl = None
    if token_count is None:
        loss = (per_token * mask).sum() / mask.sum().clamp(min=1)
    else:
        loss = (per_token * mask).sum() / max(token_count, 1)
    with torch.no_grad():
        outside = (ratio < 1 - config.clip_low) | (ratio > 1 + config.clip_high)
        kl_sum = (kl * mask).sum() if kl is not None else mask.new_zeros(())
        sums = torch.stack([kl_sum.float(), (outside & mask.bool()).sum().float(), mask.sum().float()])
    return loss, sums

"""The GRPO trainer: one policy update from a batch of groups, gradient accumulation, and its resumable state.

A step takes groups of trajectories of the same task. Rewards become group-relative advantages (grpo.py);
each trajectory's whole context is one sequence, and only the policy's own tokens are in the loss (the
prompt and tool results are context). The loss is the token-level mean over the whole batch, accumulated
over micro-batches of `micro_batch_size` sequences, so the update does not depend on how the batch was split.

Data-parallel training (distributed.py) shards a step's rows across processes and keeps this arithmetic: the
token count that divides the loss is the whole batch's (`_sum_over_ranks`), and the gradients are summed over
the processes (`_sync_gradients`) before clipping, so every process applies the single-process update. In one
process both hooks do nothing.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

import torch

from ..config import RunConfig
from ..protocols import Policy
from ..types import Trajectory
from .grpo import GRPOConfig, group_advantages, grpo_loss


@dataclass
class StepStats:
    loss: float
    kl: float
    entropy: float
    clip_fraction: float
    grad_norm: float
    tokens: int
    sequences: int
    learning_rate: float
    seconds: float


def training_rows(groups: list[list[Trajectory]]) -> list[list[tuple]]:
    """Each group's rows: ((token ids, loss mask, sampling logprobs), advantage) per trajectory."""
    return [[(t.training_sequence(), t.advantage) for t in group] for group in groups]


def assign_advantages(group: list[Trajectory], *, normalize_std: bool) -> bool:
    """Sets each trajectory's advantage; returns whether the group carries signal (its rewards differ)."""
    rewards = torch.tensor([[t.reward for t in group]], dtype=torch.float64)
    advantages, effective = group_advantages(rewards, normalize_std=normalize_std)
    for trajectory, advantage in zip(group, advantages[0].tolist(), strict=True):
        trajectory.advantage = advantage
    return bool(effective[0])


class GRPOTrainer:
    def __init__(self, policy: Policy, *, config: RunConfig, total_steps: int):
        self.policy = policy
        self.config = config
        self.grpo = GRPOConfig(clip_low=config.clip_low, clip_high=config.clip_high,
                               normalize_std=config.normalize_std, kl_coef=config.kl_coef)
        self.optimizer = torch.optim.AdamW(policy.trainable_parameters(), lr=config.learning_rate,
                                           weight_decay=config.weight_decay, foreach=True)
        warmup, total = config.warmup_steps, max(total_steps, 1)

        def factor(step: int) -> float:
            if warmup and step < warmup:
                return (step + 1) / warmup
            if config.lr_schedule == "linear":
                return max(0.0, 1 - (step - warmup) / max(1, total - warmup))
            return 1.0

        self.lr_scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, factor)
        self.reference = policy.frozen_copy() if config.kl_coef > 0 else None
        self.step = 0  # updates done: the policy version of the weights

    def train(self, groups: list[list[Trajectory]]) -> StepStats:
        """One update from groups whose advantages are assigned (assign_advantages)."""
        return self.train_rows(training_rows(groups))

    def train_rows(self, grouped: list[list[tuple]]) -> StepStats:
        """One update from groups of rows, (training sequence, advantage) each (training_rows)."""
        started = time.monotonic()
        self.policy.train()
        device = self.policy.device
        rows = [row for group in grouped for row in group]
        sequences, total_tokens = (int(n) for n in self._sum_over_ranks(
            [len(rows), sum(sum(mask[1:]) for (_, mask, _), _ in rows)]))
        if not sequences:  # no group carried signal: nothing to learn from, but the step (and its schedule) passes
            learning_rate = self.optimizer.param_groups[0]["lr"]
            self.lr_scheduler.step()
            self.step += 1
            return StepStats(loss=0.0, kl=0.0, entropy=0.0, clip_fraction=0.0, grad_norm=0.0, tokens=0, sequences=0,
                             learning_rate=learning_rate, seconds=time.monotonic() - started)
        totals = {"loss": 0.0, "kl": 0.0, "entropy": 0.0, "clip_fraction": 0.0}
        for chunk in self._micro_batches(grouped):
            width = max(len(ids) for (ids, _, _), _ in chunk)
            ids = torch.zeros(len(chunk), width, dtype=torch.long)
            mask = torch.zeros(len(chunk), width)
            attention = torch.zeros(len(chunk), width, dtype=torch.long)
            old = torch.zeros(len(chunk), width)
            for row, ((seq, seq_mask, seq_old), _) in enumerate(chunk):
                ids[row, :len(seq)] = torch.tensor(seq)
                mask[row, :len(seq)] = torch.tensor(seq_mask, dtype=torch.float)
                attention[row, :len(seq)] = 1
                old[row, :len(seq)] = torch.tensor(seq_old)
            ids, mask, attention, old = ids.to(device), mask.to(device), attention.to(device), old.to(device)
            advantages = torch.tensor([adv for _, adv in chunk], dtype=torch.float, device=device)
            # Logprobs from the first position any row of the chunk trains on: the prompts before it are context.
            first = int(mask[:, 1:].argmax(dim=1).min())
            new, entropy = self.policy.logprobs(ids, attention, self.config.temperature, first)
            ref = self.reference.logprobs(ids, attention, self.config.temperature, first) if self.reference else None
            target_mask = mask[:, 1 + first:]
            loss, stats = grpo_loss(new, old[:, 1 + first:], advantages, target_mask, self.grpo, ref_logprobs=ref,
                                    token_count=total_tokens)
            loss.backward()
            tokens = stats["tokens"]
            totals["loss"] += loss.item()
            totals["kl"] += stats["kl"] * tokens
            totals["clip_fraction"] += stats["clip_fraction"] * tokens
            totals["entropy"] += float((entropy * target_mask).sum())
        self._sync_gradients()
        totals = dict(zip(totals, self._sum_over_ranks(list(totals.values())), strict=True))
        grad_norm = torch.nn.utils.clip_grad_norm_(self.policy.trainable_parameters(), self.config.max_grad_norm)
        learning_rate = self.optimizer.param_groups[0]["lr"]
        self.optimizer.step()
        self.lr_scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        denominator = max(total_tokens, 1)
        return StepStats(loss=totals["loss"], kl=totals["kl"] / denominator, entropy=totals["entropy"] / denominator,
                         clip_fraction=totals["clip_fraction"] / denominator, grad_norm=float(grad_norm),
                         tokens=total_tokens, sequences=sequences, learning_rate=learning_rate,
                         seconds=time.monotonic() - started)

    def _sum_over_ranks(self, values: list[float]) -> list[float]:
        """The values summed over the data-parallel processes: here, one process, the values themselves."""
        return values

    def _sync_gradients(self) -> None:
        """Make every process's gradients the whole batch's: here, one process, they are."""

    def _micro_batches(self, grouped: list[list[tuple]]) -> list[list[tuple]]:
        """Rows — (training sequence, advantage) — in micro-batches of at most micro_batch_size.

        For a policy that computes a prompt all rows of a micro-batch share once (HFPolicy), micro-batches take
        whole groups while they fit, so a micro-batch of one group's size shares its prompt (the real model's
        case: 8 samples of a 40-600-token prompt) and a large one still takes many groups in one pass (a tiny
        model, where a forward call costs more than the tokens it saves). Otherwise similar lengths share a
        micro-batch, for less padding."""
        size = self.config.micro_batch_size
        if not getattr(self.policy, "shares_prompts", False):
            rows = sorted((row for group in grouped for row in group), key=lambda row: len(row[0][0]))
            return [rows[start:start + size] for start in range(0, len(rows), size)]
        chunks, current = [], []
        for group in grouped:
            if len(group) > size:  # a group larger than a micro-batch: its own pieces, each sharing the prompt
                chunks += [group[start:start + size] for start in range(0, len(group), size)]
                continue
            if len(current) + len(group) > size:
                chunks.append(current)
                current = []
            current += group
        return chunks + ([current] if current else [])

    # --- resumable state ---------------------------------------------------------------------------------

    def state(self) -> dict:
        """Everything but the weights (saved as safetensors beside it): optimizer, schedule, RNG."""
        return {"optimizer": self.optimizer.state_dict(), "lr_scheduler": self.lr_scheduler.state_dict(),
                "step": self.step, "torch_rng": torch.get_rng_state(),
                "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
                "python_rng": _python_rng_to_json(random.getstate())}

    def restore(self, state: dict) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.lr_scheduler.load_state_dict(state["lr_scheduler"])
        self.step = state["step"]
        torch.set_rng_state(state["torch_rng"])
        if state["cuda_rng"] and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["cuda_rng"])
        random.setstate(_python_rng_from_json(state["python_rng"]))


def _python_rng_to_json(state) -> list:
    version, internal, gauss = state
    return [version, list(internal), gauss]


def _python_rng_from_json(data) -> tuple:
    version, internal, gauss = data
    return version, tuple(internal), gauss

"""The GRPO trainer: one policy update from a batch of groups, gradient accumulation, and its resumable state.

A step takes groups of trajectories of the same task. Rewards become group-relative advantages (grpo.py);
each trajectory's whole context is one sequence, and only the policy's own tokens are in the loss (the
prompt and tool results are context). The loss is the token-level mean over the whole batch, accumulated
over micro-batches, so the update does not depend on how the batch was split.

Micro-batches are sized for the device (`_micro_batches`): on a GPU by a budget of padded tokens, so a step is a
few large passes (the GPU idles between small ones); on a CPU by `micro_batch_size` sequences, whole groups
together, so a group's shared prompt is computed once. A step's batch tensors are built once, before its first
pass, and copied to the device from pinned memory without waiting; the statistics stay on the device until the
step's end, so nothing inside the loop waits for the device. Under bf16 (`precision`) the passes run in bf16
autocast while the weights, their gradients and AdamW's state stay fp32; the logprobs are fp32 either way
(policies.token_logprobs).

Data-parallel training (distributed.py) shards a step's rows across processes and keeps this arithmetic: the
token count that divides the loss is the whole batch's (`_sum_over_ranks`), and the gradients are summed over
the processes (`_sync_gradients`) before clipping, so every process applies the single-process update. In one
process both hooks do nothing.
"""

from __future__ import annotations

import contextlib
import random
import time
from dataclasses import dataclass

import torch

from ..config import GRPOConfig, TrainingConfig
from ..models.policies import autocast_dtype
from ..protocols import Policy
from ..types import Trajectory
from .grpo import group_advantages, grpo_terms

# TrainingConfig.micro_batch_tokens 0 on a GPU: one pass of a 16 × 8 × 64-token step of a small model, a few of
# a long-context one; activations of a 135M model at this many tokens are a few GiB.
GPU_MICRO_BATCH_TOKENS = 32_768


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


def training_rows(groups: list[list[Trajectory]], *, oldest_version: int | None = None) -> list[list[tuple]]:
    """Each group's rows: ((token ids, loss mask, sampling logprobs), advantage) per trajectory. With
    `oldest_version` (partial rollouts), tokens sampled by older weights are left out of the loss, and a trajectory
    with no token left in it gives no row (its reward still counted in its group's advantages)."""
    rows = [[(t.training_sequence(oldest_version), t.advantage) for t in group] for group in groups]
    if oldest_version is None:
        return rows
    rows = [[row for row in group if any(row[0][1])] for group in rows]
    return [group for group in rows if group]


def micro_batch_tokens(config: TrainingConfig, device: str) -> int:
    """The padded-token budget of a micro-batch on `device` (0: none, micro_batch_size sequences decide)."""
    if config.micro_batch_tokens:
        return config.micro_batch_tokens
    return GPU_MICRO_BATCH_TOKENS if torch.device(device).type == "cuda" else 0


@dataclass
class MicroBatch:
    """One forward/backward's padded tensors, on the policy's device."""

    ids: torch.Tensor  # (B, T) token ids, right-padded with 0
    attention: torch.Tensor  # (B, T) 1 on real tokens
    mask: torch.Tensor  # (B, T) 1 on the policy's own tokens (the loss's)
    old: torch.Tensor  # (B, T) the sampling logprobs
    advantages: torch.Tensor  # (B,)
    first: int  # the first position any row trains on (ids[:, first + 1] is the first trained token)


def padded_batch(rows: list[tuple], device: str) -> MicroBatch:
    """Rows — ((ids, loss mask, sampling logprobs), advantage) — as one MicroBatch on `device`: built on the host
    in one go per tensor, then copied from pinned memory without waiting (the device orders the copy before the
    kernels that read it)."""
    width = max(len(ids) for (ids, _, _), _ in rows)
    lengths = torch.tensor([len(ids) for (ids, _, _), _ in rows])
    ids = torch.tensor([list(seq) + [0] * (width - len(seq)) for (seq, _, _), _ in rows], dtype=torch.long)
    mask = torch.tensor([[float(m) for m in seq_mask] + [0.0] * (width - len(seq_mask))
                         for (_, seq_mask, _), _ in rows], dtype=torch.float)
    old = torch.tensor([list(seq_old) + [0.0] * (width - len(seq_old)) for (_, _, seq_old), _ in rows],
                       dtype=torch.float)
    attention = (torch.arange(width).unsqueeze(0) < lengths.unsqueeze(1)).long()
    advantages = torch.tensor([advantage for _, advantage in rows], dtype=torch.float)
    # Where the first trained token of any row is: the prompts before it are context, no vocabulary softmax.
    first = int(mask[:, 1:].argmax(dim=1).min())
    if torch.device(device).type == "cuda":
        ids, attention, mask, old, advantages = (t.pin_memory().to(device, non_blocking=True)
                                                 for t in (ids, attention, mask, old, advantages))
    elif torch.device(device).type != "cpu":
        ids, attention, mask, old, advantages = (t.to(device) for t in (ids, attention, mask, old, advantages))
    return MicroBatch(ids=ids, attention=attention, mask=mask, old=old, advantages=advantages, first=first)


def assign_advantages(group: list[Trajectory], *, normalize_std: bool) -> bool:
    """Sets each trajectory's advantage; returns whether the group carries signal (its rewards differ)."""
    rewards = torch.tensor([[t.reward for t in group]], dtype=torch.float64)
    advantages, effective = group_advantages(rewards, normalize_std=normalize_std)
    for trajectory, advantage in zip(group, advantages[0].tolist(), strict=True):
        trajectory.advantage = advantage
    return bool(effective[0])


class PolicyOptimizer:
    """What every trainer of a run shares (GRPO here, SFT and DPO in supervised.py): AdamW over the policy's
    trainable parameters, the learning-rate schedule (warmup, then constant or linear), gradient clipping, and the
    resumable state a checkpoint keeps beside the weights."""

    def __init__(self, policy: Policy, *, config: TrainingConfig, total_steps: int):
        self.policy = policy
        self.config = config
        device = str(policy.device)
        self.autocast_dtype = autocast_dtype(config.precision, device)
        # fused on a GPU: one kernel updates every parameter; the CPU keeps foreach, as it was measured with.
        on_cuda = torch.device(device).type == "cuda"
        self.optimizer = torch.optim.AdamW(policy.trainable_parameters(), lr=config.learning_rate,
                                           weight_decay=config.weight_decay,
                                           **({"fused": True} if on_cuda else {"foreach": True}))
        warmup, total = config.warmup_steps, max(total_steps, 1)

        def factor(step: int) -> float:
            if warmup and step < warmup:
                return (step + 1) / warmup
            if config.lr_schedule == "linear":
                return max(0.0, 1 - (step - warmup) / max(1, total - warmup))
            return 1.0

        self.lr_scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, factor)
        self.step = 0  # updates done: the policy version of the weights

    def autocast(self):
        """The passes' autocast context (bf16 under `precision`), or none."""
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(torch.device(self.policy.device).type, dtype=self.autocast_dtype)

    def apply_gradients(self) -> tuple[float, float]:
        """Clip the accumulated gradients, take the optimizer's step and the schedule's; returns (the gradient's
        norm before clipping, the learning rate the step used)."""
        grad_norm = torch.nn.utils.clip_grad_norm_(self.policy.trainable_parameters(), self.config.max_grad_norm)
        learning_rate = self.optimizer.param_groups[0]["lr"]
        self.optimizer.step()
        self.lr_scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        return float(grad_norm), learning_rate

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


class GRPOTrainer(PolicyOptimizer):
    def __init__(self, policy: Policy, *, config: GRPOConfig, total_steps: int):
        super().__init__(policy, config=config, total_steps=total_steps)
        self.micro_batch_tokens = micro_batch_tokens(config, str(policy.device))
        self.reference = policy.frozen_copy() if config.kl_coef > 0 else None

    def oldest_trained_version(self) -> int | None:
        """With partial rollouts (an async run's), the oldest policy version whose tokens this step trains on;
        None: every token of the batch's trajectories (the selection bounded their staleness as a whole)."""
        if self.config.mode != "async" or not self.config.partial_rollouts:
            return None
        return self.step - self.config.max_staleness

    def train(self, groups: list[list[Trajectory]]) -> StepStats:
        """One update from groups whose advantages are assigned (assign_advantages).

        The importance ratio's denominator is each token's behaviour logprob, recorded by the engine as it sampled
        the token (Turn.logprobs), never recomputed: under partial rollouts the tokens of one trajectory come
        from several policy versions (and the later ones from new weights reading the old weights' cached keys and
        values), and only the recorded logprob is the probability the token was really drawn with. The ratio is
        clipped PPO-style against that behaviour policy, as it always was. AReaL's decoupled PPO clips against a
        proximal policy instead and weights by π_prox / π_behaviour (capped); with one update per batch, as here,
        the proximal policy is the current one and that objective becomes an unclipped importance weight — not
        taken: the per-token staleness bound is what keeps a token's behaviour policy near the trained one."""
        return self.train_rows(training_rows(groups, oldest_version=self.oldest_trained_version()))

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
        batches = [padded_batch(chunk, device) for chunk in self._micro_batches(grouped)]
        autocast = self.autocast()
        # loss, KL over tokens, clipped tokens, entropy over tokens: summed on the device, read once at the end
        sums = torch.zeros(4, dtype=torch.float64, device=device)
        temperature = self.config.temperature
        for batch in batches:
            first = batch.first
            with autocast:
                new, entropy = self.policy.logprobs(batch.ids, batch.attention, temperature, first)
                ref = (self.reference.logprobs(batch.ids, batch.attention, temperature, first)
                       if self.reference else None)
            target_mask = batch.mask[:, 1 + first:]
            loss, terms = grpo_terms(new, batch.old[:, 1 + first:], batch.advantages, target_mask, self.config,
                                     ref_logprobs=ref, token_count=total_tokens)
            loss.backward()
            sums += torch.stack([loss.detach(), terms[0], terms[1], (entropy * target_mask).sum()]).double()
        totals = dict(zip(("loss", "kl", "clip_fraction", "entropy"), sums.tolist(), strict=True))
        self._sync_gradients()
        totals = dict(zip(totals, self._sum_over_ranks(list(totals.values())), strict=True))
        grad_norm, learning_rate = self.apply_gradients()
        denominator = max(total_tokens, 1)
        return StepStats(loss=totals["loss"], kl=totals["kl"] / denominator, entropy=totals["entropy"] / denominator,
                         clip_fraction=totals["clip_fraction"] / denominator, grad_norm=grad_norm,
                         tokens=total_tokens, sequences=sequences, learning_rate=learning_rate,
                         seconds=time.monotonic() - started)

    def _sum_over_ranks(self, values: list[float]) -> list[float]:
        """The values summed over the data-parallel processes: here, one process, the values themselves."""
        return values

    def _sync_gradients(self) -> None:
        """Make every process's gradients the whole batch's: here, one process, they are."""

    def _micro_batches(self, grouped: list[list[tuple]]) -> list[list[tuple]]:
        """Rows — (training sequence, advantage) — in micro-batches: of at most `micro_batch_tokens` padded tokens
        (rows × the longest row) where a token budget applies (a GPU), else of at most micro_batch_size rows.

        For a policy that computes a prompt all rows of a micro-batch share once (HFPolicy), micro-batches take
        whole groups while they fit, so a micro-batch of one group's size shares its prompt (the real model's
        case on a CPU: 8 samples of a 40-600-token prompt) and a large one still takes many groups in one pass
        (a tiny model, or a GPU, where a forward call costs more than the tokens it saves); a group that does not
        fit alone is split into pieces that do. Otherwise similar lengths share a micro-batch, for less padding."""
        budget = self.micro_batch_tokens
        size = self.config.micro_batch_size

        def fits(rows: list[tuple]) -> bool:
            if budget:
                return len(rows) * max(len(ids) for (ids, _, _), _ in rows) <= budget
            return len(rows) <= size

        def pieces(rows: list[tuple]) -> list[list[tuple]]:  # in order, each as large as fits (one row at least)
            chunks, current = [], []
            for row in rows:
                if current and not fits(current + [row]):
                    chunks.append(current)
                    current = []
                current.append(row)
            return chunks + ([current] if current else [])

        if not getattr(self.policy, "shares_prompts", False):
            return pieces(sorted((row for group in grouped for row in group), key=lambda row: len(row[0][0])))
        chunks, current = [], []
        for group in grouped:
            if not fits(group):  # a group larger than a micro-batch: its own pieces, each sharing the prompt
                chunks += pieces(group)
                continue
            if current and not fits(current + group):
                chunks.append(current)
                current = []
            current += group
        return chunks + ([current] if current else [])


def _python_rng_to_json(state) -> list:
    version, internal, gauss = state
    return [version, list(internal), gauss]


def _python_rng_from_json(data) -> tuple:
    version, internal, gauss = data
    return version, tuple(internal), gauss

"""The SFT and DPO trainers: one update from a batch of tokenized rows, accumulated over micro-batches.

- SFT: the mean negative log-likelihood of the assistant's tokens over the whole batch (prompts and tool results
  are context, masked out of the loss): the sum over every micro-batch's trained tokens, divided by the batch's
  count of them, as TRL's SFTTrainer divides by `num_items_in_batch`. How the batch is split changes nothing.
- DPO (sigmoid loss, Rafailov et al. 2023): for each pair, the policy's summed log-probability of the chosen and
  the rejected answer (their assistant tokens) minus the reference's; the loss is -log σ(β · (chosen's ratio -
  rejected's)), averaged over the batch's pairs, as TRL's DPOTrainer computes it. The reference is the model the
  run started from (with LoRA: the base, adapters off); its log-probabilities are computed once, before the first
  update of an attempt, for the rows the run will train on (`precompute_reference`), and cached: no reference
  model is kept and no reference pass is taken per step.

Micro-batches take rows of similar length (sorted), so little is padded, and each computes the tokens before
its first trained one without the vocabulary softmax, and once for rows that start alike (a DPO pair's two
answers share their prompt: policies._hf_logits). Where the attention takes packed rows without a dense mask
(`packs_sequences`: flash attention, a GPU's), a micro-batch's rows are instead passed padding-free, end to end
in one row whose positions restart at each row. Not on a CPU: there attention over a pack is one dense masked
square, 2.2x slower than the padded rows for 4 × 130 tokens of the tiny Llama, a slowdown growing with the
pack. Micro-batches are micro_batch_size rows on a CPU, a budget of tokens on a GPU (trainer.micro_batch_tokens).
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from ..config import DPOConfig, SFTConfig
from ..protocols import Policy
from .trainer import PolicyOptimizer, micro_batch_tokens


@dataclass(frozen=True)
class TokenRow:
    """One tokenized sequence: its ids, and 1 where a token is trained on (the first token never is)."""

    ids: tuple[int, ...]
    mask: tuple[int, ...]

    @property
    def trained(self) -> int:
        return sum(self.mask[1:])


@dataclass(frozen=True)
class PairRow:
    chosen: TokenRow
    rejected: TokenRow


@dataclass
class SupervisedStats:
    loss: float
    grad_norm: float
    learning_rate: float
    tokens: int  # every token of the step's sequences (what the passes computed)
    trained_tokens: int  # the tokens in the loss
    rows: int
    seconds: float
    extra: dict = field(default_factory=dict)  # DPO: implicit rewards, margins, accuracy, log-probabilities


def truncated(row: TokenRow, length: int | None) -> TokenRow:
    """The row's first `length` tokens (None: all): a conversation longer than the model's context keeps its
    start, as TRL's `keep_start`."""
    if length is None or len(row.ids) <= length:
        return row
    return TokenRow(row.ids[:length], row.mask[:length])


class SequenceLogprobs:
    """Per-token log-probabilities of a micro-batch's rows, flattened: `values` (the policy's, differentiable),
    `mask` (1 on trained tokens) and `row` (which row each position belongs to), all 1-D and aligned."""

    def __init__(self, policy: Policy, rows: list[TokenRow]):
        device = policy.device
        if getattr(policy, "packs_sequences", False):
            ids = torch.tensor([[token for row in rows for token in row.ids]], dtype=torch.long)
            positions = torch.cat([torch.arange(len(row.ids)) for row in rows]).unsqueeze(0)
            # A row's first token follows the previous row's last: never trained (TokenRow's rule, kept here).
            mask = torch.tensor([m if i else 0 for row in rows for i, m in enumerate(row.mask)], dtype=torch.float)
            owner = torch.cat([torch.full((len(row.ids),), n) for n, row in enumerate(rows)])
            values, _ = policy.packed_logprobs(ids.to(device), positions.to(device))
            self.values, self.mask, self.row = values[0], mask[1:].to(device), owner[1:].to(device)
        else:
            width = max(len(row.ids) for row in rows)
            ids = torch.tensor([list(row.ids) + [0] * (width - len(row.ids)) for row in rows], dtype=torch.long)
            mask = torch.tensor([list(row.mask) + [0] * (width - len(row.mask)) for row in rows], dtype=torch.float)
            attention = (torch.arange(width).unsqueeze(0) < torch.tensor([len(r.ids) for r in rows]).unsqueeze(1))
            # From the first trained token of any row on: the prompts before it need no vocabulary softmax, and
            # rows starting alike (a pair's two answers) compute that start once (policies._hf_logits).
            first = max(0, int(mask[:, 1:].argmax(dim=1).min()))
            values, _ = policy.logprobs(ids.to(device), attention.long().to(device), 1.0, first, with_entropy=False)
            self.values = values.reshape(-1)
            self.mask = mask[:, 1 + first:].reshape(-1).to(device)
            self.row = torch.arange(len(rows)).unsqueeze(1).expand(-1, width - 1 - first).reshape(-1).to(device)
        self.rows = len(rows)

    def per_row_sums(self) -> torch.Tensor:
        """(rows,) each row's summed log-probability over its trained tokens."""
        sums = torch.zeros(self.rows, dtype=self.values.dtype, device=self.values.device)
        return sums.index_add(0, self.row, self.values * self.mask)


class SupervisedTrainer(PolicyOptimizer):
    """The shared part of SFT and DPO: micro-batches, the update, the statistics. `train(rows)` is one step."""

    kind = ""

    def __init__(self, policy: Policy, *, config: SFTConfig, total_steps: int):
        super().__init__(policy, config=config, total_steps=total_steps)
        self.micro_batch_tokens = micro_batch_tokens(config, str(policy.device))

    def _micro_batches(self, items: list, length) -> list[list]:
        """`items` in micro-batches of at most micro_batch_size items, or on a GPU of at most micro_batch_tokens
        tokens (`length(item)` each; an item longer than the budget goes alone); similar lengths together."""
        budget, size = self.micro_batch_tokens, self.config.micro_batch_size
        chunks, current, tokens = [], [], 0
        for item in sorted(items, key=length):
            over = tokens + length(item) > budget if budget else len(current) >= size
            if current and over:
                chunks.append(current)
                current, tokens = [], 0
            current.append(item)
            tokens += length(item)
        return chunks + ([current] if current else [])


class SFTTrainer(SupervisedTrainer):
    kind = "sft"

    def train(self, rows: list[TokenRow]) -> SupervisedStats:
        started = time.monotonic()
        self.policy.train()
        trained = sum(row.trained for row in rows)
        total = torch.zeros((), dtype=torch.float64, device=self.policy.device)
        for chunk in self._micro_batches(rows, lambda row: len(row.ids)):
            with self.autocast():
                logprobs = SequenceLogprobs(self.policy, chunk)
            loss = -(logprobs.values * logprobs.mask).sum() / max(trained, 1)
            loss.backward()
            total += loss.detach().double()
        grad_norm, learning_rate = self.apply_gradients()
        return SupervisedStats(loss=float(total), grad_norm=grad_norm, learning_rate=learning_rate,
                               tokens=sum(len(row.ids) for row in rows), trained_tokens=trained, rows=len(rows),
                               seconds=time.monotonic() - started)


class DPOTrainer(SupervisedTrainer):
    kind = "dpo"

    def __init__(self, policy: Policy, *, config: DPOConfig, total_steps: int):
        super().__init__(policy, config=config, total_steps=total_steps)
        self.beta = config.dpo_beta
        self.reference: dict[PairRow, tuple[float, float]] = {}

    def _pair_passes(self, pairs: list[PairRow]) -> list[list[PairRow]]:
        return self._micro_batches(pairs, lambda pair: len(pair.chosen.ids) + len(pair.rejected.ids))

    @torch.no_grad()
    def precompute_reference(self, pairs: list[PairRow], progressed=None) -> None:
        """The reference's summed log-probabilities of each pair's chosen and rejected answer, computed with the
        policy's current weights — the ones the run starts from, so call this before a checkpoint is restored —
        and kept for the attempt. With LoRA the adapters are switched off, so the base model is the reference
        even where the adapters have moved. `progressed()` is called after each micro-batch (the heartbeat's)."""
        missing = list(dict.fromkeys(pair for pair in pairs if pair not in self.reference))
        if not missing:
            return
        was_training = getattr(self.policy.model, "training", False)
        self.policy.model.eval()
        lora = getattr(self.policy, "lora", False)
        try:
            for chunk in self._pair_passes(missing):
                adapters_off = self.policy.model.disable_adapter() if lora else contextlib.nullcontext()
                with adapters_off, self.autocast():
                    sums = self._sums(chunk)
                for pair, chosen, rejected in zip(chunk, *sums.view(2, -1).tolist(), strict=True):
                    self.reference[pair] = (chosen, rejected)
                if progressed is not None:
                    progressed()
        finally:
            self.policy.model.train(was_training)

    def _sums(self, pairs: list[PairRow]) -> torch.Tensor:
        """(2 × pairs,) the summed log-probabilities: every chosen answer, then every rejected one."""
        return SequenceLogprobs(self.policy, [p.chosen for p in pairs] + [p.rejected for p in pairs]).per_row_sums()

    def train(self, pairs: list[PairRow]) -> SupervisedStats:
        started = time.monotonic()
        self.precompute_reference(pairs)  # a no-op where the attempt computed them before its first step
        self.policy.train()
        device = self.policy.device
        # loss, chosen reward, rejected reward, correctly ordered pairs, chosen log-prob, rejected log-prob
        totals = torch.zeros(6, dtype=torch.float64, device=device)
        for chunk in self._pair_passes(pairs):
            with self.autocast():
                sums = self._sums(chunk).float()
            chosen, rejected = sums.view(2, -1)
            reference = torch.tensor([self.reference[pair] for pair in chunk], dtype=torch.float32, device=device)
            chosen_reward = self.beta * (chosen - reference[:, 0])
            rejected_reward = self.beta * (rejected - reference[:, 1])
            loss = -F.logsigmoid(chosen_reward - rejected_reward).sum() / len(pairs)
            loss.backward()
            with torch.no_grad():
                totals += torch.stack([loss.detach() * len(pairs), chosen_reward.sum(), rejected_reward.sum(),
                                       (chosen_reward > rejected_reward).float().sum(), chosen.sum(),
                                       rejected.sum()]).double()
        grad_norm, learning_rate = self.apply_gradients()
        loss_sum, chosen_sum, rejected_sum, right, chosen_logp, rejected_logp = (
            value / len(pairs) for value in totals.tolist())
        rows = [row for pair in pairs for row in (pair.chosen, pair.rejected)]
        return SupervisedStats(
            loss=loss_sum, grad_norm=grad_norm, learning_rate=learning_rate, tokens=sum(len(r.ids) for r in rows),
            trained_tokens=sum(r.trained for r in rows), rows=len(pairs), seconds=time.monotonic() - started,
            extra={"preference/chosen_reward": chosen_sum, "preference/rejected_reward": rejected_sum,
                   "preference/reward_margin": chosen_sum - rejected_sum, "preference/accuracy": right,
                   "logprob/chosen": chosen_logp, "logprob/rejected": rejected_logp})

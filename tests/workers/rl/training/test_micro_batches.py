"""How the trainer splits a step: the chunked logprobs equal the full log-softmax, and micro-batches sized by a
token budget cover every row once and give the update of one-group micro-batches (seconds, on the CPU)."""

import copy
import random

import pytest
import torch
from torch.nn import functional as F

from workers.rl.config import GRPOConfig
from workers.rl.models.hf_tiny import make_tiny_hf_model
from workers.rl.models.policies import COMMON_OPENING, HFPolicy, TinyLMPolicy, token_logprobs
from workers.rl.models.tiny_lm import ModelConfig, TinyLM
from workers.rl.training.trainer import GRPOTrainer, padded_batch


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_chunked_logprobs_equal_the_full_log_softmax_and_its_gradient(temperature):
    torch.manual_seed(0)
    logits = torch.randn(3, 7, 50, requires_grad=True)
    targets = torch.randint(0, 50, (3, 7))
    weights = torch.randn(3, 7)
    full = F.log_softmax(logits / temperature, dim=-1)
    expected = full.gather(2, targets.unsqueeze(2)).squeeze(2)
    expected_entropy = -(full.exp() * full).sum(-1)
    (expected * weights).sum().backward()
    expected_grad, logits.grad = logits.grad, None

    # 4 positions a chunk: 21 positions make 5 full chunks and a last one of 1
    chosen, entropy = token_logprobs(logits, targets, temperature, chunk_elements=4 * 50)
    (chosen * weights).sum().backward()
    assert chosen.dtype == torch.float32 and not entropy.requires_grad
    assert torch.allclose(chosen, expected, atol=1e-5)
    assert torch.allclose(entropy, expected_entropy, atol=1e-5)
    assert torch.allclose(logits.grad, expected_grad, atol=1e-6)


def _step_rows(vocab: int, *, groups: int = 3, group: int = 4) -> list[list[tuple]]:
    """Groups of rows ((ids, loss mask, sampling logprobs), advantage): a prompt shared by a group's rows, then
    completions of different lengths, as a step of rollouts has them."""
    rng = random.Random(0)
    grouped = []
    for _ in range(groups):
        prompt = [rng.randrange(1, vocab) for _ in range(rng.randint(3, 6))]
        rows = []
        for _ in range(group):
            completion = [rng.randrange(1, vocab) for _ in range(rng.randint(1, 5))]
            rows.append(((prompt + completion, [0] * len(prompt) + [1] * len(completion),
                          [0.0] * len(prompt) + [-rng.uniform(0.5, 3.0) for _ in completion]),
                         rng.uniform(-1.0, 1.0)))
        grouped.append(rows)
    return grouped


def _policies(kind: str, tmp_path):
    if kind == "hf":  # shares a group's prompt within a micro-batch
        directory = make_tiny_hf_model(tmp_path / "tiny", hidden_size=32, layers=1, heads=2, max_positions=64)
        policy = HFPolicy(str(directory))
        vocab = policy.model.config.vocab_size
    else:
        torch.manual_seed(0)
        policy = TinyLMPolicy(TinyLM(ModelConfig(vocab_size=20, block_size=32, n_layer=1, n_embd=32, n_head=2)))
        vocab = 20
    twin = copy.copy(policy)
    twin.model = copy.deepcopy(policy.model)
    return policy, twin, vocab


# 30 padded tokens: a group of 4 rows × 8-11 tokens is split; 100: two groups share a pass, three do not
@pytest.mark.parametrize("budget", [30, 100])
@pytest.mark.parametrize("kind", ["hf", "tinylm"])
def test_a_token_budget_covers_every_row_once_with_the_update_of_one_group_micro_batches(kind, budget, tmp_path):
    by_group, by_tokens, vocab = _policies(kind, tmp_path)
    grouped = _step_rows(vocab)
    settings = {"kl_coef": 0.0, "precision": "fp32", "max_grad_norm": 1e6}
    one_group = GRPOTrainer(by_group, config=GRPOConfig.resolve({**settings, "micro_batch_size": 4}), total_steps=1)
    budgeted = GRPOTrainer(by_tokens, config=GRPOConfig.resolve({**settings, "micro_batch_size": 1,
                                                                "micro_batch_tokens": budget}), total_steps=1)

    chunks = budgeted._micro_batches(grouped)
    rows = [row for group in grouped for row in group]
    assert sorted(id(row) for chunk in chunks for row in chunk) == sorted(id(row) for row in rows)
    assert len(chunks) > 1  # the budget splits the step, not micro_batch_size (1 row)
    for chunk in chunks:
        assert len(chunk) == 1 or len(chunk) * max(len(ids) for (ids, _, _), _ in chunk) <= budget
    assert len(one_group._micro_batches(grouped)) in (3, len(rows) // 4 + 1)

    for trainer in (one_group, budgeted):  # the weights then move by the gradient itself (AdamW's first step
        # is about lr × its sign, which turns rounding in a near-zero gradient into a full step)
        trainer.optimizer = torch.optim.SGD(trainer.policy.trainable_parameters(), lr=1.0)
    first, second = one_group.train_rows(grouped), budgeted.train_rows(grouped)
    assert first.tokens == second.tokens and first.sequences == second.sequences == len(rows)
    assert second.loss == pytest.approx(first.loss, abs=1e-6)
    assert second.entropy == pytest.approx(first.entropy, abs=1e-5)
    assert second.grad_norm == pytest.approx(first.grad_norm, rel=1e-5)
    for a, b in zip(by_group.trainable_parameters(), by_tokens.trainable_parameters(), strict=True):
        assert torch.allclose(a, b, atol=1e-6)


def test_a_gpu_packs_a_step_into_few_passes_and_a_cpu_keeps_micro_batch_size(tmp_path):
    policy, _, vocab = _policies("hf", tmp_path)
    grouped = _step_rows(vocab, groups=8, group=8)
    cpu = GRPOTrainer(policy, config=GRPOConfig.resolve({"micro_batch_size": 8}), total_steps=1)
    assert cpu.micro_batch_tokens == 0 and cpu.autocast_dtype is None
    assert [len(chunk) for chunk in cpu._micro_batches(grouped)] == [8] * 8  # one group a pass, as before
    cpu.micro_batch_tokens = 32_768  # what a GPU gets by default (micro_batch_tokens 0)
    assert [len(chunk) for chunk in cpu._micro_batches(grouped)] == [64]


def test_the_plain_pass_a_gpu_takes_gives_the_logprobs_of_the_shared_prompt_passes(tmp_path):
    policy, _, vocab = _policies("hf", tmp_path)
    batch = padded_batch([row for group in _step_rows(vocab, groups=2, group=3) for row in group], "cpu")
    assert policy.shares_prompts  # on a CPU
    shared, shared_entropy = policy.logprobs(batch.ids, batch.attention, 0.8, batch.first)
    policy.shares_prompts = False  # as on a GPU
    plain, plain_entropy = policy.logprobs(batch.ids, batch.attention, 0.8, batch.first)
    trained = batch.mask[:, batch.first + 1:].bool()
    assert torch.allclose(shared[trained], plain[trained], atol=1e-5)
    assert torch.allclose(shared_entropy[trained], plain_entropy[trained], atol=1e-5)


def test_rows_whose_prompts_differ_but_open_alike_compute_the_opening_once_with_the_same_logprobs_and_gradients(
        tmp_path):
    """An SFT batch of one template: the same system message and tools' instructions, then each row's own prompt
    and answer. The opening is computed once; what the rows learn is what one plain pass gives."""
    policy, twin, vocab = _policies("hf", tmp_path)
    rng = random.Random(1)
    opening = [rng.randrange(1, vocab) for _ in range(COMMON_OPENING + 3)]
    rows = []
    for length in (3, 5, 4):
        prompt = opening + [rng.randrange(1, vocab) for _ in range(length)]
        answer = [rng.randrange(1, vocab) for _ in range(rng.randint(2, 6))]
        rows.append(((prompt + answer, [0] * len(prompt) + [1] * len(answer), [0.0] * (len(prompt) + len(answer))),
                     0.0))
    batch = padded_batch(rows, "cpu")
    assert len(torch.unique(batch.ids[:, :batch.first + 1], dim=0)) == len(rows)  # no two prompts alike
    calls = []
    hook = policy.model.register_forward_pre_hook(lambda _, args, kwargs: calls.append(kwargs["input_ids"].shape),
                                                  with_kwargs=True)
    shared, _ = policy.logprobs(batch.ids, batch.attention, 1.0, batch.first)
    hook.remove()
    assert calls[0] == (1, len(opening))  # the opening once, then every row's own tokens
    assert calls[1] == (len(rows), batch.ids.shape[1] - 1 - len(opening))
    twin.shares_prompts = False
    plain, _ = twin.logprobs(batch.ids, batch.attention, 1.0, batch.first)
    trained = batch.mask[:, batch.first + 1:].bool()
    assert torch.allclose(shared[trained], plain[trained], atol=1e-5)
    shared[trained].sum().backward()
    plain[trained].sum().backward()
    for mine, theirs in zip(policy.trainable_parameters(), twin.trainable_parameters(), strict=True):
        assert torch.allclose(mine.grad, theirs.grad, atol=1e-5)

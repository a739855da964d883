"""The tiny model's KV-cached sampling and the GRPO update, on the CPU."""

import pytest
import torch

from workers.rl.config import GRPOConfig
from workers.rl.models.tiny_lm import ModelConfig, TinyLM, sequence_logprobs
from workers.rl.training.grpo import group_advantages, grpo_loss


def test_zero_variance_groups_carry_no_signal_and_are_counted():
    rewards = torch.tensor([[1.0, 0.0, 1.0, 0.0], [1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0]])
    advantages, effective = group_advantages(rewards)
    assert effective.tolist() == [True, False, False]
    assert torch.allclose(advantages[0], torch.tensor([1.0, -1.0, 1.0, -1.0]), atol=1e-4)
    assert advantages[1:].abs().sum() == 0
    centred, _ = group_advantages(rewards, normalize_std=False)  # Dr. GRPO: no division by the spread
    assert torch.allclose(centred[0], torch.tensor([0.5, -0.5, 0.5, -0.5]))


def test_the_upper_clip_is_higher_than_the_lower_and_stops_the_gradient_beyond_it():
    config = GRPOConfig(clip_low=0.2, clip_high=0.28)
    old = torch.zeros(4, 1)
    new = torch.log(torch.tensor([[1.25], [1.35], [0.85], [0.75]])).requires_grad_()
    advantages = torch.tensor([1.0, 1.0, -1.0, -1.0])
    loss, stats = grpo_loss(new, old, advantages, torch.ones(4, 1), config)
    loss.backward()
    grad = new.grad.squeeze(1)
    assert grad[0] != 0 and grad[1] == 0  # ratio 1.25 is inside [0.8, 1.28]; 1.35 is clipped
    assert grad[2] != 0 and grad[3] == 0  # 0.85 inside; 0.75 below the lower clip with a negative advantage
    assert stats["clip_fraction"] == 0.5


def test_masked_tokens_and_the_kl_penalty():
    new = torch.tensor([[-1.0, -1.0], [-2.0, -5.0]])
    old = new.clone()
    ref = torch.tensor([[-1.0, -1.0], [-1.0, -5.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    without, _ = grpo_loss(new, old, torch.zeros(2), mask, GRPOConfig())
    with_kl, stats = grpo_loss(new, old, torch.zeros(2), mask, GRPOConfig(kl_coef=0.5), ref_logprobs=ref)
    assert without == 0 and stats["tokens"] == 3
    expected_kl = (torch.exp(torch.tensor(1.0)) - 1 - 1) / 3  # only the one differing, unmasked token
    assert stats["kl"] == pytest.approx(float(expected_kl), rel=1e-5) and with_kl > 0


def test_cached_sampling_reports_the_logprobs_a_full_forward_pass_computes():
    torch.manual_seed(0)
    model = TinyLM(ModelConfig(vocab_size=12, block_size=16)).eval()
    tokens, logprobs = model.generate([1, 2, 3], samples=5, max_new_tokens=6,
                                      seed=1)
    assert tokens.shape == logprobs.shape == (5, 6)
    assert torch.allclose(sequence_logprobs(model, [1, 2, 3], tokens), logprobs, atol=1e-5)


def test_grpo_steps_move_probability_to_the_rewarded_answer():
    """A bandit: the reward is 1 when the first token is 7. A few updates must make 7 more likely."""
    torch.manual_seed(0)
    model = TinyLM(ModelConfig(vocab_size=10, block_size=8, n_layer=1, n_embd=32, n_head=2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    prompt, config = [1, 2], GRPOConfig()

    def p_seven():
        with torch.no_grad():
            logits, _ = model(torch.tensor([prompt]))
        return float(torch.softmax(logits[0, -1], dim=-1)[7])

    before = p_seven()
    for iteration in range(15):
        tokens, old = model.generate(prompt, samples=16, max_new_tokens=1, seed=iteration)
        rewards = (tokens[:, 0] == 7).float().unsqueeze(0)
        advantages, _ = group_advantages(rewards)
        loss, _ = grpo_loss(sequence_logprobs(model, prompt, tokens), old, advantages[0], torch.ones_like(old),
                            config)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert before < 0.2 and p_seven() > 0.8, (before, p_seven())

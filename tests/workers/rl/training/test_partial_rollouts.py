"""Partial rollouts (issue 45): new weights arrive while a completion is being sampled, each token keeps the version
and logprob it was really sampled with, the loss's importance ratio takes those recorded logprobs, the versions
survive the archive and a checkpoint, and the staleness bound holds per token."""

import copy
import json

import pytest
import torch

from workers.rl.config import GRPOConfig
from workers.rl.engines import GenerationRequest
from workers.rl.engines.speculation import OFF
from workers.rl.engines.torch_engine import TorchEngine
from workers.rl.models.chat_formats import CharChat
from workers.rl.models.policies import TinyLMPolicy
from workers.rl.rollout.collectors import Group, too_stale
from workers.rl.rollout.metrics import token_staleness
from workers.rl.training.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from workers.rl.training.grpo import grpo_loss
from workers.rl.training.trainer import GRPOTrainer, assign_advantages, padded_batch, training_rows
from workers.rl.types import Trajectory, Turn

RUN_ID = "00000000-0000-4000-8000-0000000000a5"
SWAP_AFTER = 4  # tokens of sample 0 written when the new weights are handed over


def _trajectory(seq: int, sample: int, *, prompt: list[int], turns: list[Turn], version: int) -> Trajectory:
    return Trajectory(id=f"{seq}/{sample}", run_id=RUN_ID, seq=seq, sample=sample, domain="arithmetic",
                      template="task_template/add@1", task_key="add-3-4", task_hash="", image="", verifier="",
                      policy_version=version, prompt_ids=list(prompt), turns=turns)


def _perturbed(model, seed: int):
    """Other weights of the same model: the trainer's after an update, as far as the engine can tell."""
    other = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in other.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=generator) * 0.05)
    return other


def _recomputed(policy, prompt: list[int], tokens: list[int]) -> list[float]:
    ids = torch.tensor([prompt + tokens])
    with torch.no_grad():
        logprobs, _ = policy.logprobs(ids, torch.ones_like(ids), 1.0)
    return logprobs[0, len(prompt) - 1:].tolist()


@pytest.fixture
def swapped(addition_base_model):
    """Two samples of 12 tokens from version 0 of the tiny model, version 1's weights handed to the engine as
    sample 0 writes its 4th token (from the engine's own loop: no timing involved)."""
    old = TinyLMPolicy(copy.deepcopy(addition_base_model))
    new = TinyLMPolicy(_perturbed(addition_base_model, seed=7))
    engine, chat = TorchEngine(old.model, speculation=OFF), CharChat()
    prompt = chat.prompt([{"role": "user", "content": "3+4="}], [])
    written = [0]

    def on_token(sample: int, token: int) -> None:
        if sample == 0:
            written[0] += 1
            if written[0] == SWAP_AFTER:
                engine.load_weights(new.inference_state(), version=1)

    request = GenerationRequest(prompt, n=2, max_new_tokens=12, stop_ids=(), temperature=1.0, seed=5,
                                on_token=on_token)
    try:
        [group] = engine.generate([request])
    finally:
        engine.close()
    return old, new, prompt, group


def test_a_weight_swap_mid_completion_changes_the_tokens_versions_at_the_swap(swapped):
    old, _new, prompt, group = swapped
    for completion in group:
        assert len(completion.token_ids) == 12 and completion.policy_version == 0  # stamped with the oldest
        # Both rows held 4 tokens when the weights changed; the 5th was drawn from the logits the old weights had
        # already computed, the 6th on are the new weights'.
        assert completion.token_versions == [0] * (SWAP_AFTER + 1) + [1] * (12 - SWAP_AFTER - 1)
        under_old = _recomputed(old, prompt, completion.token_ids)
        recorded = completion.logprobs
        assert recorded[:SWAP_AFTER + 1] == pytest.approx(under_old[:SWAP_AFTER + 1], abs=1e-4)
        assert max(abs(a - b) for a, b in zip(recorded[SWAP_AFTER + 1:], under_old[SWAP_AFTER + 1:],
                                              strict=True)) > 1e-3, "the new weights sampled nothing"


def test_the_loss_takes_the_recorded_behaviour_logprobs_not_recomputed_ones(swapped):
    old, new, prompt, group = swapped
    trajectories = [
        _trajectory(0, sample, prompt=prompt, version=0, turns=[Turn(
            role="assistant", content="", token_ids=c.token_ids, logprobs=c.logprobs, versions=c.token_versions)])
        for sample, c in enumerate(group)]
    for trajectory, reward in zip(trajectories, (1.0, 0.0), strict=True):
        trajectory.reward = reward
    assert assign_advantages(trajectories, normalize_std=True)
    config = GRPOConfig.resolve({"mode": "async", "max_staleness": 1, "partial_rollouts": True,
                                 "micro_batch_size": 8, "learning_rate": 1e-3, "eval_tasks_per_domain": 0})
    trainer = GRPOTrainer(new, config=config, total_steps=2)
    trainer.step = 1  # the trainer's weights are version 1: both versions' tokens are within the bound

    rows = training_rows([trajectories], oldest_version=trainer.oldest_trained_version())
    batch = padded_batch([row for group_rows in rows for row in group_rows], "cpu")
    first = len(prompt) - 1
    recorded = batch.old[:, 1 + first:]
    assert recorded[:, :12].flatten().tolist() == pytest.approx([lp for c in group for lp in c.logprobs], abs=1e-6)
    # What a trainer that recomputed the old logprobs under one version (the oldest, 0) would have divided by.
    recomputed = torch.tensor([_recomputed(old, prompt, c.token_ids) for c in group])
    new.train()
    with torch.no_grad():
        current, _ = new.logprobs(batch.ids, batch.attention, 1.0, first)
    mask = batch.mask[:, 1 + first:]
    with_recorded, _ = grpo_loss(current, recorded, batch.advantages, mask, config)
    with_recomputed, _ = grpo_loss(current, recomputed, batch.advantages, mask, config)
    assert abs(with_recorded.item() - with_recomputed.item()) > 1e-4

    stats = trainer.train([trajectories])  # the loss is computed before the update: the same weights as above
    assert stats.tokens == 24
    assert stats.loss == pytest.approx(with_recorded.item(), abs=1e-5)
    assert stats.loss != pytest.approx(with_recomputed.item(), abs=1e-5)


def _mixed_turns() -> list[Turn]:
    """An assistant turn sampled across an update (versions 3 then 4), a tool result, and a turn all version 5."""
    return [Turn(role="assistant", content="ab", token_ids=[11, 12, 13, 14], logprobs=[-0.1, -0.2, -0.3, -0.4],
                 versions=[3, 3, 4, 4]),
            Turn(role="tool", content="r", token_ids=[20, 21]),
            Turn(role="assistant", content="c", token_ids=[15, 16], logprobs=[-0.5, -0.6], versions=[5, 5])]


def test_versions_survive_the_archive_round_trip_and_older_records_still_read():
    trajectory = _trajectory(3, 1, prompt=[1, 2], turns=_mixed_turns(), version=3)
    stored = json.loads(json.dumps(trajectory.to_json()))
    assert stored["turns"][0]["versions"] == [[3, 2], [4, 2]]  # runs, not a number per token
    assert "versions" not in stored["turns"][1]
    back = Trajectory.from_json(stored)
    assert [t.versions for t in back.turns] == [[3, 3, 4, 4], [], [5, 5]]
    assert back.trained_versions() == [3, 3, 4, 4, 5, 5]
    # A turn stored before versions were kept: its tokens count as the trajectory's oldest version.
    del stored["turns"][2]["versions"]
    older = Trajectory.from_json(stored)
    assert older.turns[2].versions == [] and older.trained_versions() == [3, 3, 4, 4, 3, 3]


def test_per_token_staleness_masks_old_tokens_and_drops_a_group_only_when_nothing_is_fresh():
    trajectory = _trajectory(3, 0, prompt=[1, 2], turns=_mixed_turns(), version=3)
    ids, mask, logprobs = trajectory.training_sequence()
    assert ids == [1, 2, 11, 12, 13, 14, 20, 21, 15, 16] and mask == [0, 0, 1, 1, 1, 1, 0, 0, 1, 1]
    _, bounded, same_logprobs = trajectory.training_sequence(oldest_version=4)
    assert bounded == [0, 0, 0, 0, 1, 1, 0, 0, 1, 1] and same_logprobs == logprobs
    assert trajectory.training_sequence(oldest_version=6)[1] == [0] * 10

    # Trained at version 6 with a bound of 1 (oldest version 5): the whole-trajectory rule drops the group, the
    # per-token one keeps it for its last turn; at version 7 nothing is fresh enough and both drop it.
    assert too_stale([trajectory], version=6, max_staleness=1)
    assert not too_stale([trajectory], version=6, max_staleness=1, per_token=True)
    assert too_stale([trajectory], version=7, max_staleness=1, per_token=True)

    all_old = _trajectory(3, 1, prompt=[1, 2], version=3, turns=[Turn(
        role="assistant", content="x", token_ids=[11], logprobs=[-0.1], versions=[3])])
    trajectory.advantage, all_old.advantage = 1.0, -1.0
    [rows] = training_rows([[trajectory, all_old]], oldest_version=5)
    assert len(rows) == 1 and rows[0][0][1] == [0, 0, 0, 0, 0, 0, 0, 0, 1, 1]  # no token left: no row
    assert len(training_rows([[trajectory, all_old]])[0]) == 2

    staleness, counts = token_staleness([trajectory, all_old], version=6, oldest_version=5, max_staleness=1)
    assert counts == {"0": 0, "1": 2, "too_stale": 5} and staleness == [1, 3]
    _, whole = token_staleness([trajectory], version=5, oldest_version=None, max_staleness=2)
    assert whole == {"0": 2, "1": 2, "2": 2}


def test_the_trainer_bounds_tokens_only_in_an_async_run_with_partial_rollouts(addition_base_model):
    policy = TinyLMPolicy(copy.deepcopy(addition_base_model))
    for overrides, oldest in (({"mode": "async", "max_staleness": 2}, 3), ({"mode": "sync"}, None),
                              ({"mode": "async", "partial_rollouts": False}, None)):
        trainer = GRPOTrainer(policy, config=GRPOConfig.resolve({**overrides, "eval_tasks_per_domain": 0}),
                              total_steps=10)
        trainer.step = 5
        assert trainer.oldest_trained_version() == oldest, overrides


def test_per_token_versions_survive_a_checkpoint_and_resume(make_pipeline, tmp_path):
    """A verified group waiting in the async buffer when the checkpoint is written comes back with each token's
    version, and the resumed trainer bounds its tokens by them."""
    first, _ = make_pipeline(4, mode="async", max_staleness=1, checkpoint_dir=tmp_path / "ckpt")
    task = first.tasks.task(0, "task_template/add@1", "add-3-4")
    waiting = [_trajectory(0, sample, prompt=[1, 2], turns=_mixed_turns(), version=3) for sample in range(2)]
    for trajectory, reward in zip(waiting, (1.0, 0.0), strict=True):
        trajectory.reward = reward
    first.collector.restore([Group(task, waiting)])
    try:
        save_checkpoint(tmp_path / "ckpt", step=6, policy=first.policy, trainer_state=first.trainer.state(),
                        pipeline_state=first.loop_state(), keep=2)
    finally:
        first.close()
        first.engine.close()

    second, _ = make_pipeline(4, mode="async", max_staleness=1, checkpoint_dir=tmp_path / "ckpt")
    try:
        trainer_state, pipeline_state = load_checkpoint(latest_checkpoint(tmp_path / "ckpt"), policy=second.policy)
        second.trainer.restore(trainer_state)
        second.trainer.step = 6
        second.restore_state(pipeline_state)
        [group] = second.collector.in_flight()[1]
        assert [[turn.versions for turn in t.turns] for t in group.trajectories] == \
            [[[3, 3, 4, 4], [], [5, 5]]] * 2
        usable = second._select(group, [])
        assert usable is not None, "fresh tokens at version 5: the group is trained on, its older tokens masked"
        rows = training_rows([usable], oldest_version=second.trainer.oldest_trained_version())
        assert [row[0][1][-4:] for row in rows[0]] == [[0, 0, 1, 1]] * 2
    finally:
        second.close()
        second.engine.close()


def test_the_trajectory_page_counts_tokens_by_version_and_the_run_page_stacks_them():
    from apps.common.figures import panels_for
    from apps.trajectories.replay import tokens_by_version

    trajectory = _trajectory(3, 0, prompt=[1, 2], turns=_mixed_turns(), version=3)
    assert tokens_by_version(trajectory.to_json()["turns"]) == [(3, 2), (4, 2), (5, 2)]
    one_version = _trajectory(3, 1, prompt=[1], version=2, turns=[Turn(
        role="assistant", content="x", token_ids=[11, 12], logprobs=[-0.1, -0.2], versions=[2, 2])])
    assert tokens_by_version(one_version.to_json()["turns"]) == []
    [(panel, names)] = panels_for(["tokens_by_staleness/0", "tokens_by_staleness/1", "tokens_by_staleness/too_stale"])
    assert panel.key == "tokens_by_staleness" and panel.stacked and len(names) == 3

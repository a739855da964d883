"""The pipeline end to end on the CPU: sync resume is bit-identical (after a pause, and after a stop its process was
asked for), async respects its staleness bound, every consumed trajectory is archived once with the step that
consumed it."""

import threading
import time

import pytest
import torch

from tests.support.training import pause_after
from workers.rl.training.checkpoint import checkpoints


def _weights(pipeline):
    return {k: v.clone() for k, v in pipeline.policy.model.state_dict().items()}


class StopsTheProcessAt:
    """The run's own verifier, which asks the process to stop as its `answers`+1st verdict is wanted: a Ctrl-C that
    comes while a step's groups are being graded."""

    def __init__(self, verifier, stop: threading.Event, answers: int):
        self.verifier, self.stop, self.answers = verifier, stop, answers
        self._lock = threading.Lock()

    def verify(self, template, trajectory, item):
        with self._lock:
            self.answers -= 1
            stopping = self.answers == -1
        if stopping:
            self.stop.set()
            time.sleep(1.0)  # a slow verdict: the collector, checking every 50 ms, sees the stop while it waits
        return self.verifier.verify(template, trajectory, item)


@pytest.mark.parametrize("stopped_by", ["pause", "stop"])
def test_sync_mode_resumed_from_a_checkpoint_continues_bit_identically(make_pipeline, tmp_path, stopped_by):
    """Paused at the end of step 2, or its process asked to stop while step 3 is graded: either way the run's
    checkpoint is step 2's (none was due: checkpoint_every 4), and the run resumed from it trains as if it had never
    stopped."""
    config = {"mode": "sync", "checkpoint_every": 4, "groups_per_step": 4, "group_size": 6, "dynamic_sampling": False}
    straight, straight_tracker = make_pipeline(4, checkpoint_dir=tmp_path / "straight", **config)
    summary = straight.run()
    assert summary["outcome"] == "completed" and summary["steps"] == 4

    first, tracker = make_pipeline(4, checkpoint_dir=tmp_path / "resumed", tracker=pause_after(2), **config)
    if stopped_by == "stop":
        tracker.on_step = None
        first.stop = threading.Event()
        first.verifier = StopsTheProcessAt(first.verifier, first.stop, answers=2 * 4 * 6)
    stopped = first.run()
    assert (stopped["outcome"], stopped["steps"]) == ({"pause": "paused", "stop": "interrupted"}[stopped_by], 2)
    assert [s["step"] for s in tracker.steps] == [1, 2]  # step 3's groups were being graded: dropped
    assert [c.step for c in checkpoints(tmp_path / "resumed")] == tracker.checkpoints == [2]

    tracker.requested = ""
    tracker.on_step = None
    second, _ = make_pipeline(4, checkpoint_dir=tmp_path / "resumed", tracker=tracker, **config)
    resumed = second.run()
    assert resumed["outcome"] == "completed" and resumed["resumed_from_step"] == 2

    expected, actual = _weights(straight), _weights(second)
    assert expected.keys() == actual.keys()
    for name in expected:
        assert torch.equal(expected[name], actual[name]), f"{name} differs after resume"
    # The same trajectories, with the same samples and rewards, were consumed at the same steps.
    assert sorted(straight_tracker.trajectories) == sorted(tracker.trajectories)
    for trajectory_id, trajectory in straight_tracker.trajectories.items():
        other = tracker.trajectories[trajectory_id]
        assert (trajectory.step, trajectory.reward, trajectory.response) == (other.step, other.reward, other.response)
    straight_points = {s["step"]: s["points"]["reward/mean"] for s in straight_tracker.steps}
    assert straight_points == {s["step"]: s["points"]["reward/mean"] for s in tracker.steps}


@pytest.mark.parametrize("partial_rollouts", [False, True])
def test_async_mode_never_trains_on_data_staler_than_its_bound(make_pipeline, partial_rollouts):
    """Whole trajectories within the bound; with partial rollouts, every token the loss took (older ones are left
    out of it: training/trainer.py), each step's trained tokens counted by staleness on the run page."""
    pipeline, tracker = make_pipeline(6, mode="async", max_staleness=1, rollout_concurrency=4,
                                      partial_rollouts=partial_rollouts)
    summary = pipeline.run()
    assert summary["steps"] == 6 and summary["staleness"]["max"] <= 1
    trained = [t for t in tracker.trajectories.values() if t.effective]
    assert trained, "no group carried signal: the test's base model should be unreliable, not hopeless"
    # Trained at step s means trained against weights of version s - 1.
    if partial_rollouts:
        behind = [(t.step - 1) - v for t in trained for v in t.trained_versions() if (t.step - 1) - v <= 1]
        assert min(behind) >= 0
    else:
        assert all(0 <= (t.step - 1) - t.policy_version <= 1 for t in trained)
        behind = [(t.step - 1) - t.policy_version for t in trained]
    assert max(behind) == 1, "async never overlapped generation and training"
    for step in tracker.steps:
        points = step["points"]
        assert points.get("staleness/max", 0) <= 1
        assert ("tokens_by_staleness/too_stale" in points) == partial_rollouts
        assert points["tokens_by_staleness/0"] + points["tokens_by_staleness/1"] <= sum(
            t.completion_tokens for t in trained if t.step == step["step"])
    assert sum(summary["staleness"]["tokens"].values()) == sum(len(t.trained_versions()) for t in trained)


def test_a_staleness_bound_of_zero_is_on_policy(make_pipeline):
    pipeline, tracker = make_pipeline(3, mode="async", max_staleness=0, rollout_concurrency=4)
    pipeline.run()
    trained = [t for t in tracker.trajectories.values() if t.effective]
    assert trained and all(t.policy_version == t.step - 1 for t in trained)


def test_every_consumed_trajectory_is_archived_once_with_its_verdict(make_pipeline):
    pipeline, tracker = make_pipeline(3, mode="sync", group_size=4)
    summary = pipeline.run()
    archived = list(tracker.trajectories.values())
    assert len(archived) == summary["trajectories"]["total"] == len({t.id for t in archived})
    by_draw = {}
    for t in archived:
        by_draw.setdefault(t.seq, []).append(t.sample)
        assert t.step in (1, 2, 3) and t.verdict.components[0].name == "answer"
        assert t.reward == (1.0 if t.response.strip() == str(sum(int(x) for x in t.task_key.split("-")[1:])) else 0.0)
    # Sync draws are consumed in order: every draw 0..n-1 is there with its whole group.
    assert sorted(by_draw) == list(range(len(by_draw)))
    assert all(sorted(samples) == [0, 1, 2, 3] for samples in by_draw.values())
    # Groups whose rewards are all equal were consumed but not trained on.
    flat = [t for t in archived if t.effective is False]
    assert all(len({u.reward for u in archived if u.seq == t.seq}) == 1 or t.status_reason for t in flat)
    assert summary["trajectories"]["effective"] == sum(bool(t.effective) for t in archived)


def test_idle_time_is_attributed_and_metrics_are_namespaced(make_pipeline):
    pipeline, tracker = make_pipeline(2, mode="sync")
    pipeline.run()
    points = tracker.steps[-1]["points"]
    for name in ("reward/mean", "reward/arithmetic", "throughput/effective_trajectories_per_hour",
                 "throughput/trajectories_per_hour", "cost/per_task", "idle/generation", "idle/verification",
                 "idle/environment_assembly", "idle/timeouts", "trainer/busy_fraction", "policy/kl",
                 "policy/entropy", "staleness/max"):
        assert name in points, name
    # Sync mode waits for generation every step: the trainer's idle time has to show it.
    assert sum(step["points"]["idle/generation"] for step in tracker.steps) > 0
    assert 0 < points["trainer/busy_fraction"] < 1


def test_a_sync_run_samples_every_step_from_the_trainers_updated_model(make_pipeline):
    """The engine shares the trainer's model: each step's samples come from the weights the previous step left
    (policy version step - 1), with the logprobs the trainer recomputes; an async run refuses such an engine."""
    pipeline, tracker = make_pipeline(3, mode="sync")
    assert pipeline.engine.shares_weights and pipeline.engine.model is pipeline.policy.model
    pipeline.run()
    consumed = list(tracker.trajectories.values())
    assert consumed and all(t.policy_version == t.step - 1 for t in consumed)
    assert {t.policy_version for t in consumed} == {0, 1, 2}
    # The ratio to the sampling distribution starts at 1: a step's first recompute matches the engine's logprobs.
    assert all(s["points"]["policy/clip_fraction"] == 0 for s in tracker.steps)
    with pytest.raises(ValueError, match="needs a sync run"):
        make_pipeline(1, mode="async", share=True)

"""The task scheduler: weighted mixing, quotas, the curriculum, determinism and resume."""

from collections import Counter

import pytest

from workers.rl.tasks.scheduler import Curriculum, DomainMix, ScheduledTask, Scheduler, TemplateMix

ARITH = DomainMix("arithmetic", 3.0, (TemplateMix("task_template/add-two@1", 1.0, tuple(f"a{i}" for i in range(50))),))
CODE = DomainMix("coding", 1.0, (TemplateMix("task_template/functions@1", 1.0, tuple(f"c{i}" for i in range(20))),))


def test_domains_are_mixed_by_weight():
    batch = Scheduler([ARITH, CODE], seed=0).sample(4000)
    share = Counter(task.domain for task in batch)["arithmetic"] / len(batch)
    assert 0.72 < share < 0.78  # 3:1


def test_the_same_seed_gives_the_same_batches_and_a_restored_state_continues_them():
    first, second = Scheduler([ARITH, CODE], seed=7), Scheduler([ARITH, CODE], seed=7)
    assert first.sample(64) == second.sample(64)
    saved = first.state()
    expected = first.sample(32)
    resumed = Scheduler([ARITH, CODE], seed=999)
    resumed.restore(saved)
    assert resumed.sample(32) == expected
    assert Scheduler([ARITH, CODE], seed=8).sample(64) != Scheduler([ARITH, CODE], seed=7).sample(64)


def test_a_quota_caps_a_domains_share_of_each_batch():
    capped = DomainMix("arithmetic", 100.0, ARITH.templates, quota=0.25)
    for _ in range(20):
        batch = Scheduler([capped, CODE], seed=1).sample(16)
        assert Counter(t.domain for t in batch)["arithmetic"] <= 4
    with pytest.raises(ValueError, match="quotas leave no room"):
        Scheduler([DomainMix("only", 1.0, CODE.templates, quota=0.1)], seed=0).sample(30)


def test_the_curriculum_down_weights_tasks_always_or_never_solved():
    curriculum = Curriculum()
    template = ARITH.templates[0]
    for index, key in enumerate(template.task_keys[:40]):  # 40 of 50 tasks are stale: 20 always solved, 20 never
        for _ in range(3):
            rewards = [1.0] * 8 if index < 20 else [0.0] * 8
            curriculum.observe(ScheduledTask("arithmetic", template.key, key), rewards)
    batch = Scheduler([ARITH], seed=3, curriculum=curriculum).sample(3000)
    informative = sum(task.task_key in template.task_keys[40:] for task in batch) / len(batch)
    # 10 informative tasks at weight 1 against 40 stale at 0.1: 10 / (10 + 4) of the draws
    assert 0.66 < informative < 0.76


def test_a_mix_without_tasks_or_weight_is_refused():
    with pytest.raises(ValueError, match="positive weight"):
        Scheduler([DomainMix("x", 0.0, CODE.templates)], seed=0)
    with pytest.raises(ValueError, match="templates without tasks: task_template/empty@1"):
        Scheduler([DomainMix("x", 1.0, (TemplateMix("task_template/empty@1", 1.0, ()),))], seed=0)


def test_a_template_never_solved_shrinks_its_domains_share_and_the_state_keeps_it():
    curriculum = Curriculum()
    for index in range(4):  # four groups of coding, all failed: no signal left in that template
        curriculum.observe(ScheduledTask("coding", CODE.templates[0].key, f"c{index}"), [0.0] * 8)
    scheduler = Scheduler([DomainMix("arithmetic", 1.0, ARITH.templates), CODE], seed=5, curriculum=curriculum)
    saved = scheduler.state()
    batch = scheduler.sample(4000)
    coding = sum(task.domain == "coding" for task in batch) / len(batch)
    assert 0.07 < coding < 0.11  # 0.1 against 1: 1/11 of the draws instead of half
    resumed = Scheduler([DomainMix("arithmetic", 1.0, ARITH.templates), CODE], seed=0, curriculum=Curriculum())
    resumed.restore(saved)
    assert resumed.sample(4000) == batch

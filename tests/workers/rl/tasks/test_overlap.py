"""Suite/training overlap: the same instance is exact; a prompt that shares a 13-word run is a near duplicate,
unless many training prompts share that run (a template's instructions); anything else is clean."""

import dataclasses

from workers.rl.tasks.overlap import ngrams, overlap, shared_phrasing
from workers.rl.tasks.taskset import TaskSet
from workers.verifiers import Item

from ..conftest import addition_template

LONG = "a train leaves the station at nine and travels north at sixty miles an hour until it reaches the coast"


def _tasks(prompts: dict[str, str], hashes: dict[str, str]) -> TaskSet:
    template = dataclasses.replace(addition_template(), prompt_template="{text}")
    items = {key: Item(key=key, inputs={"text": text}, hidden={"answer": 0}) for key, text in prompts.items()}
    tasks = TaskSet.single_template(template, items)
    tasks.item_hashes[template.key] = hashes
    return tasks


def test_exact_near_and_clean():
    training = _tasks({"t1": LONG, "t2": "what is two plus two"}, {"t1": "h1", "t2": "h2"})
    suite_set = _tasks({"s1": "what is two plus two", "s2": "Question: " + LONG.upper() + "?", "s3": "3+4="},
                       {"s1": "h2", "s2": "h9", "s3": "h8"})
    suite = [suite_set.task(i, "task_template/add@1", key) for i, key in enumerate(["s1", "s2", "s3"])]
    assert overlap(suite, training) == {"exact": ["add/s1"], "near": ["add/s2"]}


def test_short_prompts_are_one_ngram_and_long_ones_slide():
    assert ngrams("3+4=") == {("3", "4")}
    assert len(ngrams(LONG)) == len(LONG.split()) - 12


INSTRUCTIONS = "Give the number with its unit and scale, and quote the exact sentence of the report that states it."


def test_a_run_many_training_prompts_share_is_phrasing_not_a_near_duplicate():
    """A held-out task of a template with long instructions shares them with every training task of it: that is the
    template's phrasing, not the task. A run only a few training prompts share still counts."""
    training = _tasks({f"t{i}": f"What was the revenue of company {i} in {2000 + i}? {INSTRUCTIONS}" for i in range(11)}
                      | {"t-twice": LONG, "t-twice-2": LONG + " again"},
                      {f"t{i}": f"h{i}" for i in range(11)} | {"t-twice": "hx", "t-twice-2": "hy"})
    suite_set = _tasks({"s1": f"What was the revenue of company 99 in 1999? {INSTRUCTIONS}", "s2": LONG + "?"},
                       {"s1": "h98", "s2": "h99"})
    suite = [suite_set.task(i, "task_template/add@1", key) for i, key in enumerate(["s1", "s2"])]
    assert overlap(suite, training) == {"exact": [], "near": ["add/s2"]}
    assert shared_phrasing([ngrams(LONG)] * 11) == ngrams(LONG) and shared_phrasing([ngrams(LONG)] * 10) == set()

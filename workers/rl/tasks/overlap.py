"""Overlap between an eval suite's tasks and a training pool: exact (the same task instance, by content hash)
and near-duplicate (a shared 13-gram of words in the prompt, as GPT-3's contamination analysis did; a prompt
shorter than 13 words counts as one n-gram of its own length). A 13-gram that more than PHRASING training
prompts share is the pool's phrasing — a template's instructions, a generator's fixed clause — and is no
evidence: otherwise every held-out instance of a template with a long instruction would read as trained on.
The studio owns both its RL task pools and its suites, so it can say which scores were earned on tasks the
model trained on."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable

from ..types import Task
from .taskset import TaskSet

N = 13
PHRASING = 10  # more training prompts than this sharing a 13-gram make it phrasing
WORD = re.compile(r"\w+")


def prompt_text(task: Task) -> str:
    return "\n".join(m["content"] for m in task.template.messages(task.item, examples=False) if m["role"] == "user")


def ngrams(text: str, n: int = N) -> set[tuple[str, ...]]:
    words = WORD.findall(text.lower())
    if len(words) < n:
        return {tuple(words)} if words else set()
    return {tuple(words[i:i + n]) for i in range(len(words) - n + 1)}


def task_label(template_key: str, task_key: str) -> str:
    """A task as evaluation results, overlap reports and review datasets name it: template slug / task key (the
    same task under any version of its template)."""
    return f"{template_key.partition('@')[0].removeprefix('task_template/')}/{task_key}"


def task_id(task: Task) -> str:
    return task_label(task.template.key, task.item.key)


def shared_phrasing(prompts: Iterable[set[tuple[str, ...]]], *, more_than: int = PHRASING) -> set[tuple[str, ...]]:
    """The n-grams found in more than `more_than` of these prompts' n-gram sets."""
    counts = Counter(gram for grams in prompts for gram in grams)
    return {gram for gram, count in counts.items() if count > more_than}


def overlap(suite: list[Task], training: TaskSet) -> dict[str, list[str]]:
    """{"exact": [...], "near": [...]}: the suite's tasks found in the training pool, by task id; a task in
    "exact" is not repeated in "near"."""
    hashes: set[str] = set()
    prompts: list[set[tuple[str, ...]]] = []
    for template_key, items in training.items.items():
        for key in items:
            task = training.task(0, template_key, key)
            hashes.add(task.item_hash)
            prompts.append(ngrams(prompt_text(task)))
    grams = set().union(*prompts) - shared_phrasing(prompts)
    exact, near = [], []
    for task in suite:
        if task.item_hash in hashes:
            exact.append(task_id(task))
        elif ngrams(prompt_text(task)) & grams:
            near.append(task_id(task))
    return {"exact": sorted(exact), "near": sorted(near)}

"""The demo's held-out tasks: what its eval suite asks and its run never trains on.

Each task template the demo bundle trains on gives a few of its instances to a held-out twin (the same spec under
its own slug), and each of the bundle's domains gets a twin drawing from those; the eval suite pins the twins, so
the leaderboard scores checkpoints on tasks they never saw. The instances held out are whole groups of near
duplicates — prompts sharing a 13-word sequence that is not the template's phrasing, as the overlap check reads
them (workers/rl/tasks/overlap.py) — the smallest groups first: the check finds every suite task clean, and the training
pool gives up as little as it can.
"""

import random
from dataclasses import replace

from workers.rl.tasks.overlap import PHRASING, ngrams, shared_phrasing

from .draft import Draft

HELD_OUT = 10  # instances a template holds out, at least: a group of near duplicates is never split
SUFFIX = "-held-out"
SEED = 7


def held_out_split(instances: list[dict], *, prompt_template: str, count: int = HELD_OUT,
                   seed: int = SEED) -> tuple[list[dict], list[dict]]:
    """(training, held out), each in generation order: groups of near duplicates, smallest first (equal sizes in a
    seeded order), until `count` instances are held out."""
    grams = [ngrams(prompt_template.format(**instance["inputs"])) for instance in instances]
    # What the check reads as phrasing once the held-out prompts have left the pool: a sequence more than
    # PHRASING + `bound` prompts share here still is; any rarer one ties the prompts sharing it into one group.
    bound = 2 * count
    common = shared_phrasing(grams, more_than=PHRASING + bound)
    rng = random.Random(seed)
    groups = sorted(_near_duplicate_groups([g - common for g in grams]), key=lambda group: (len(group), rng.random()))
    held: set[int] = set()
    for group in groups:
        if len(held) >= count:
            break
        held |= group
    if len(held) > bound:
        raise ValueError(f"holding out {count} instances takes {len(held)}: its groups of near duplicates are too "
                         f"large to leave the rest of the template's phrasing as it is")
    return ([instance for index, instance in enumerate(instances) if index not in held],
            [instance for index, instance in enumerate(instances) if index in held])


def _near_duplicate_groups(grams: list[set]) -> list[set[int]]:
    """The prompts (by index) in groups joined by any shared n-gram (union-find)."""
    parent = list(range(len(grams)))

    def root(index: int) -> int:
        while parent[index] != index:
            parent[index] = parent[parent[index]]
            index = parent[index]
        return index

    first: dict = {}
    for index, own in enumerate(grams):
        for gram in own:
            parent[root(index)] = root(first.setdefault(gram, index))
    groups: dict[int, set[int]] = {}
    for index in range(len(grams)):
        groups.setdefault(root(index), set()).add(index)
    return list(groups.values())


def held_out_drafts(drafts: list[Draft], *, domains: list[str]) -> list[Draft]:
    """`drafts` with the task templates of `domains` keeping their training instances only, followed by a held-out
    twin of each of those templates and domains."""
    trained = {_slug(draw["template"]) for d in drafts if d.kind == "domain" and d.slug in domains
               for draw in d.spec["templates"]}
    kept, twins = [], []
    for draft in drafts:
        if draft.kind == "task_template" and draft.slug in trained:
            training, held = held_out_split(draft.instances, prompt_template=draft.spec["prompt_template"])
            kept.append(replace(draft, instances=training))
            twins.append(Draft("task_template", draft.slug + SUFFIX,
                               f"Held out from {draft.slug} for the demo's eval suite: {len(held)} of its instances, "
                               "which the demo run never trains on.", draft.spec, held))
        elif draft.kind == "domain" and draft.slug in domains:
            kept.append(draft)
            twins.append(Draft("domain", draft.slug + SUFFIX, f"{draft.description} Held out: the eval suite's.",
                               {**draft.spec, "templates": [{**draw, "template": _slug(draw["template"]) + SUFFIX}
                                                            for draw in draft.spec["templates"]]}))
        else:
            kept.append(draft)
    return kept + twins


def _slug(reference: str) -> str:
    return reference.partition("@")[0].removeprefix("task_template/")

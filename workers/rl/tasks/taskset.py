"""A run's tasks as the engine sees them: pinned task templates, their instances, and the domain mix.

The studio builds one from a bundle version (apps/registry/pins.py); tests and benchmarks build one by hand
(`TaskSet.single_template`). Every task is identified by (template key, task key); a draw numbers it with `seq`.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from workers.verifiers import Item

from ..types import Task, TaskTemplate
from .scheduler import DomainMix, TemplateMix


@dataclass
class TaskSet:
    templates: dict[str, TaskTemplate]  # template key -> template
    domains: list[DomainMix]
    items: dict[str, dict[str, Item]]  # template key -> task key -> instance
    item_hashes: dict[str, dict[str, str]]  # template key -> task key -> the instance's content hash

    @classmethod
    def single_template(cls, template: TaskTemplate, items: dict[str, Item], *, weight: float = 1.0) -> TaskSet:
        """One domain of one template (its instances' keys double as their hashes): for tests and benchmarks."""
        mix = DomainMix(template.domain, weight, (TemplateMix(template.key, 1.0, tuple(items)),))
        return cls(templates={template.key: template}, domains=[mix], items={template.key: dict(items)},
                   item_hashes={template.key: {key: key for key in items}})

    def task(self, seq: int, template_key: str, task_key: str) -> Task:
        return Task(seq=seq, template=self.templates[template_key], item=self.items[template_key][task_key],
                    item_hash=self.item_hashes[template_key][task_key])

    def eval_tasks(self, *, per_domain: int, seed: int) -> list[tuple[str, str]]:
        """A fixed sample of (template key, task key) per domain, by template weight: the same at the start of
        a run and at its end."""
        rng = random.Random(f"eval-{seed}")
        chosen = []
        for domain in self.domains:
            for _ in range(per_domain):
                template = rng.choices(domain.templates, weights=[t.weight for t in domain.templates])[0]
                chosen.append((template.key, rng.choice(template.task_keys)))
        return chosen

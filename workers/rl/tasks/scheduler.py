"""Which tasks the next batch trains on: a mix across domains by weight, deterministic under a seed.

- Domains are drawn by their sampling weight, then a template within the domain by its weight, then a task
  instance of that template uniformly.
- Per-domain quotas cap a domain's share of one batch (a domain at its quota is left out of the draw).
- The optional curriculum down-weights tasks that carry no learning signal: a task the policy always solves
  or never solves (by a moving pass rate over its recent groups) is drawn `stale_weight` times as often. The
  same holds one level up, for whole templates: with thousands of instances a task is rarely seen twice, but a
  template the policy never (or always) solves is plain after a few groups, and its domain's share of the
  draws shrinks with it — the compute goes where the rewards still vary.
- The same seed, mix and history give the same batches: resuming a run replays its schedule.
"""

import random
from collections import defaultdict
from dataclasses import dataclass, field


@dataclass(frozen=True)
class TemplateMix:
    key: str  # e.g. "task_template/add-two@3"
    weight: float
    task_keys: tuple[str, ...]


@dataclass(frozen=True)
class DomainMix:
    name: str
    weight: float
    templates: tuple[TemplateMix, ...]
    quota: float | None = None  # the largest share of one batch this domain may take, e.g. 0.5
    category: str = ""  # the domain spec's category: weights and quotas can be set per category too


@dataclass(frozen=True)
class ScheduledTask:
    domain: str
    template: str
    task_key: str


@dataclass
class Curriculum:
    """Moving pass rates per task and per template; one solved always (>= high) or never (<= low) is stale."""

    low: float = 0.05
    high: float = 0.95
    stale_weight: float = 0.1
    decay: float = 0.7
    min_observations: int = 2
    min_template_observations: int = 4
    pass_rates: dict = field(default_factory=dict)
    observations: dict = field(default_factory=lambda: defaultdict(int))
    template_rates: dict = field(default_factory=dict)
    template_observations: dict = field(default_factory=lambda: defaultdict(int))

    def observe(self, task: ScheduledTask, rewards: list[float]) -> None:
        rate = sum(r >= 1.0 for r in rewards) / len(rewards)
        for rates, counts, key in ((self.pass_rates, self.observations, (task.template, task.task_key)),
                                   (self.template_rates, self.template_observations, task.template)):
            previous = rates.get(key)
            rates[key] = rate if previous is None else self.decay * previous + (1 - self.decay) * rate
            counts[key] += 1

    def _factor(self, rate: float | None, observed: int, needed: int) -> float:
        if observed < needed:
            return 1.0
        return self.stale_weight if rate <= self.low or rate >= self.high else 1.0

    def weight(self, template: str, task_key: str) -> float:
        key = (template, task_key)
        return self._factor(self.pass_rates.get(key), self.observations[key], self.min_observations)

    def template_weight(self, template: str) -> float:
        return self._factor(self.template_rates.get(template), self.template_observations[template],
                            self.min_template_observations)


class Scheduler:
    def __init__(self, domains: list[DomainMix], *, seed: int, curriculum: Curriculum | None = None):
        if not domains or all(d.weight <= 0 for d in domains):
            raise ValueError("the mix needs at least one domain with a positive weight")
        empty = [t.key for d in domains for t in d.templates if not t.task_keys]
        if empty:
            raise ValueError(f"templates without tasks: {', '.join(empty)}")
        self.domains = domains
        self.curriculum = curriculum
        self.rng = random.Random(seed)

    def sample(self, batch_size: int) -> list[ScheduledTask]:
        counts: dict[str, int] = defaultdict(int)
        batch = []
        for _ in range(batch_size):
            open_domains = [d for d in self.domains if d.weight > 0 and (
                d.quota is None or counts[d.name] + 1 <= max(1, int(d.quota * batch_size)))]
            if not open_domains:
                raise ValueError(f"the quotas leave no room for a batch of {batch_size}")
            template_weights = {d.name: [t.weight * self._template_factor(t.key) for t in d.templates]
                                for d in open_domains}
            # A domain weighs its own weight times the share of its template weight the curriculum keeps.
            domain = self.rng.choices(open_domains, weights=[
                d.weight * sum(template_weights[d.name]) / sum(t.weight for t in d.templates) for d in open_domains])[0]
            template = self.rng.choices(domain.templates, weights=template_weights[domain.name])[0]
            batch.append(ScheduledTask(domain.name, template.key, self._task(template)))
            counts[domain.name] += 1
        return batch

    def _template_factor(self, template: str) -> float:
        return 1.0 if self.curriculum is None else self.curriculum.template_weight(template)

    def _task(self, template: TemplateMix) -> str:
        if self.curriculum is None:
            return self.rng.choice(template.task_keys)
        weights = [self.curriculum.weight(template.key, key) for key in template.task_keys]
        return self.rng.choices(template.task_keys, weights=weights)[0]

    def state(self) -> dict:
        """What a checkpoint keeps so a resumed run draws the same batches (JSON-safe)."""
        version, internal, gauss = self.rng.getstate()
        state = {"rng": [version, list(internal), gauss]}
        if self.curriculum is not None:
            c = self.curriculum
            state["curriculum"] = [[template, task, rate, c.observations[(template, task)]]
                                   for (template, task), rate in sorted(c.pass_rates.items())]
            state["template_curriculum"] = [[template, rate, c.template_observations[template]]
                                            for template, rate in sorted(c.template_rates.items())]
        return state

    def restore(self, state: dict) -> None:
        version, internal, gauss = state["rng"]
        self.rng.setstate((version, tuple(internal), gauss))
        if self.curriculum is not None:
            c = self.curriculum
            c.pass_rates = {(t, k): rate for t, k, rate, _ in state.get("curriculum", [])}
            c.observations = defaultdict(int, {(t, k): n for t, k, _, n in state.get("curriculum", [])})
            c.template_rates = {t: rate for t, rate, _ in state.get("template_curriculum", [])}
            c.template_observations = defaultdict(int, {t: n for t, _, n in state.get("template_curriculum", [])})

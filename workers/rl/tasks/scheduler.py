"""Which tasks the next batch trains on: a mix across domains by weight, deterministic under a seed.

- Domains are drawn by their sampling weight, then a template within the domain by its weight, then a task
  instance of that template uniformly.
- Per-domain quotas cap a domain's share of one batch, and per-category quotas the share of a category's domains
  together (a domain at its quota, or in a category at its quota, is left out of the draw).
- The optional curriculum down-weights tasks that carry no learning signal: a task the policy always solves
  or never solves (by a moving pass rate over its recent groups) is drawn `stale_weight` times as often. The
  same holds one level up, for whole templates: with thousands of instances a task is rarely seen twice, but a
  template the policy never (or always) solves is plain after a few groups, and its domain's share of the
  draws shrinks with it — the compute goes where the rewards still vary.
- The same seed, mix and history give the same batches: resuming a run replays its schedule.

A draw costs about the same at a thousand domains as at ten: a domain's weight is worked out again only when the
curriculum changes the standing of one of its templates, the cumulative table once a step and again (from the
closed domain on) when a quota closes a domain, and a task is found among its template's stale ones by bisection
rather than by weighing every task of the template — with the same floats as the plain draw, so the same batches.
"""

import random
from bisect import bisect, bisect_left, bisect_right
from collections import defaultdict
from dataclasses import dataclass, field
from itertools import accumulate, compress


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
    # Derived from the above (reindex() rebuilds them). What a checkpoint keeps, a row per task and per template
    # ([template, task, rate, observations], [template, rate, observations]), each row replaced, never changed, so a
    # step's snapshot is a copy of the references (the training loop takes one every step) rather than a rebuild.
    task_rows: dict = field(default_factory=dict, repr=False)
    template_rows: dict = field(default_factory=dict, repr=False)
    # For the scheduler: which tasks of each template are stale now, which templates are, and when each last
    # changed — a draw reads these instead of weighing every task.
    stale_tasks: dict = field(default_factory=lambda: defaultdict(set), repr=False)
    stale_templates: set = field(default_factory=set, repr=False)
    changed: dict = field(default_factory=dict, repr=False)  # template -> revision of its stale tasks' last change
    reindexed: int = field(default=0, repr=False)  # revision of the last reindex: every template changed then
    templates_changed: int = field(default=0, repr=False)  # revision of the stale templates' last change
    template_changes: list = field(default_factory=list, repr=False)  # the templates whose standing changed, in order
    revision: int = field(default=0, repr=False)  # counts the changes to the stale sets

    def __post_init__(self) -> None:
        if self.pass_rates or self.template_rates:
            self.reindex()

    def observe(self, task: ScheduledTask, rewards: list[float]) -> None:
        rate = sum(r >= 1.0 for r in rewards) / len(rewards)
        for rates, counts, key in ((self.pass_rates, self.observations, (task.template, task.task_key)),
                                   (self.template_rates, self.template_observations, task.template)):
            previous = rates.get(key)
            rates[key] = rate if previous is None else self.decay * previous + (1 - self.decay) * rate
            counts[key] += 1
        self._row(task.template, task.task_key)
        self._restand(task.template, task.task_key)

    def _row(self, template: str, task_key: str | None) -> None:
        if task_key is not None:
            key = (template, task_key)
            self.task_rows[key] = [template, task_key, self.pass_rates[key], self.observations[key]]
        self.template_rows[template] = [template, self.template_rates[template], self.template_observations[template]]

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

    def reindex(self) -> None:
        """Rebuild the stale sets from the pass rates (after they were replaced: a restored checkpoint)."""
        self.stale_tasks, self.stale_templates, self.changed, self.template_changes = defaultdict(set), set(), {}, []
        self.task_rows, self.template_rows = {}, {}
        self.revision += 1
        self.reindexed = self.templates_changed = self.revision
        for template in self.template_rates:
            self._row(template, None)
            self._restand(template, None)
        for template, task_key in self.pass_rates:
            self._row(template, task_key)
            self._restand(template, task_key)

    def _restand(self, template: str, task_key: str | None) -> None:
        """Keep the stale sets in step with one task's (and its template's) pass rate."""
        if task_key is not None:
            stale, tasks = self.weight(template, task_key) != 1.0, self.stale_tasks[template]
            if stale != (task_key in tasks):
                (tasks.add if stale else tasks.discard)(task_key)
                self.revision += 1
                self.changed[template] = self.revision
        stale = self.template_weight(template) != 1.0
        if stale != (template in self.stale_templates):
            (self.stale_templates.add if stale else self.stale_templates.discard)(template)
            self.revision += 1
            self.templates_changed = self.revision
            self.template_changes.append(template)


class Scheduler:
    def __init__(self, domains: list[DomainMix], *, seed: int, curriculum: Curriculum | None = None,
                 category_quotas: dict[str, float] | None = None):
        if not domains or all(d.weight <= 0 for d in domains):
            raise ValueError("the mix needs at least one domain with a positive weight")
        empty = [t.key for d in domains for t in d.templates if not t.task_keys]
        if empty:
            raise ValueError(f"templates without tasks: {', '.join(empty)}")
        self.domains = domains
        self.curriculum = curriculum
        self.category_quotas = dict(category_quotas or {})
        self.rng = random.Random(seed)
        self._template_totals = [sum(t.weight for t in d.templates) for d in domains]
        self._in_category: dict[str, list[int]] = defaultdict(list)
        for index, domain in enumerate(domains):
            self._in_category[domain.category].append(index)
        self._weights_at: tuple | None = None  # (reindexed, changes read) of the curriculum the weights are at
        self._weights: tuple[list[float], list[list[float]]] = ([], [])
        self._quotas = [(index, d.quota) for index, d in enumerate(domains) if d.quota is not None]
        self._with_template: dict[str, list[int]] = defaultdict(list)  # template -> the domains drawing it
        for index, domain in enumerate(domains):
            for template in domain.templates:
                self._with_template[template.key].append(index)
        self._positions: dict[str, dict[str, int]] = {}  # template -> task key -> position, once it has stale tasks
        self._stale_at: dict[str, tuple[int, list[int]]] = {}  # template -> (revision, stale task positions)

    def sample(self, batch_size: int) -> list[ScheduledTask]:
        weights, template_weights = self._domain_weights()
        limits = {index: max(1, int(quota * batch_size)) for index, quota in self._quotas}
        category_limits = {category: max(1, int(quota * batch_size))
                           for category, quota in self.category_quotas.items()}
        counts: dict[int, int] = defaultdict(int)
        category_counts: dict[str, int] = defaultdict(int)
        is_open = [weight > 0 for weight in weights]
        candidates, cumulative = self._table(weights, is_open)
        batch = []
        for _ in range(batch_size):
            if not candidates:
                raise ValueError(f"the quotas leave no room for a batch of {batch_size}")
            # What random.choices does, on a table kept from one draw to the next.
            index = candidates[bisect(cumulative, self.rng.random() * cumulative[-1], 0, len(candidates) - 1)]
            domain = self.domains[index]
            template_table = template_weights[index]
            template = domain.templates[bisect(template_table, self.rng.random() * template_table[-1], 0,
                                               len(template_table) - 1)]
            batch.append(ScheduledTask(domain.name, template.key, self._task(template)))
            counts[index] += 1
            category = domain.category
            if category in category_limits:
                category_counts[category] += 1
                if category_counts[category] + 1 > category_limits[category]:
                    for other in self._in_category[category]:
                        is_open[other] = False
                    candidates, cumulative = self._table(weights, is_open)
            if index in limits and counts[index] + 1 > limits[index] and is_open[index]:
                is_open[index] = False
                self._close(index, candidates, cumulative, weights)
        return batch

    @staticmethod
    def _table(weights: list[float], is_open: list[bool]) -> tuple[list[int], list[float]]:
        """The open domains in order and their cumulative weights, as random.choices would build them."""
        candidates = list(compress(range(len(weights)), is_open))
        return candidates, list(accumulate(map(weights.__getitem__, candidates)))

    @staticmethod
    def _close(index: int, candidates: list[int], cumulative: list[float], weights: list[float]) -> None:
        """Take one domain out of the table: the sums before it stand, the ones after are summed again from
        there (the same additions a rebuilt table would make, so the same numbers)."""
        position = bisect_left(candidates, index)
        del candidates[position]
        tail = map(weights.__getitem__, candidates[position:])
        cumulative[position:] = list(accumulate(tail, initial=cumulative[position - 1]))[1:] if position else \
            list(accumulate(tail))

    def _domain_weights(self) -> tuple[list[float], list[list[float]]]:
        """Each domain's weight in the draw, and its templates' cumulative weights; worked out again for the
        domains whose templates the curriculum has moved in or out of the stale ones since the last draw."""
        curriculum = self.curriculum
        reindexed, changes = (0, ()) if curriculum is None else (curriculum.reindexed, curriculum.template_changes)
        if self._weights_at is None or self._weights_at[0] != reindexed:
            weights, tables = [], []
            for index in range(len(self.domains)):
                weight, table = self._domain_weight(index)
                weights.append(weight)
                tables.append(table)
            self._weights = (weights, tables)
        elif self._weights_at[1] < len(changes):
            weights, tables = self._weights
            for index in {i for template in changes[self._weights_at[1]:] for i in self._with_template[template]}:
                weights[index], tables[index] = self._domain_weight(index)
        self._weights_at = (reindexed, len(changes))
        return self._weights

    def _domain_weight(self, index: int) -> tuple[float, list[float]]:
        domain = self.domains[index]
        template_weights = [t.weight * self._template_factor(t.key) for t in domain.templates]
        # A domain weighs its own weight times the share of its template weight the curriculum keeps.
        weight = domain.weight * sum(template_weights) / self._template_totals[index] if domain.weight > 0 else 0.0
        return weight, list(accumulate(template_weights))

    def _template_factor(self, template: str) -> float:
        if self.curriculum is None or template not in self.curriculum.stale_templates:
            return 1.0
        return self.curriculum.stale_weight

    def _task(self, template: TemplateMix) -> str:
        if self.curriculum is None:
            return self.rng.choice(template.task_keys)
        stale = self._stale_positions(template)
        keys, weight = template.task_keys, self.curriculum.stale_weight
        count = len(keys)
        # random.choices over [1.0 or stale_weight per task], without the per-task table: the cumulative weight
        # up to task i is (i + 1) - (1 - stale_weight) * (stale tasks at or before i); the first i whose
        # cumulative weight passes the draw is found by bisection.
        target = self.rng.random() * (count - (1 - weight) * len(stale))
        low, high = 0, count - 1
        while low < high:
            middle = (low + high) // 2
            if (middle + 1) - (1 - weight) * bisect_right(stale, middle) > target:
                high = middle
            else:
                low = middle + 1
        return keys[low]

    def _stale_positions(self, template: TemplateMix) -> list[int]:
        """The positions of the template's stale tasks, in order (kept until the curriculum changes them)."""
        curriculum = self.curriculum
        revision = curriculum.changed.get(template.key, curriculum.reindexed)
        cached = self._stale_at.get(template.key)
        if cached is None or cached[0] != revision:
            stale = curriculum.stale_tasks.get(template.key)
            if stale:
                positions = self._positions.get(template.key)
                if positions is None:
                    positions = self._positions[template.key] = {key: i for i, key in enumerate(template.task_keys)}
                cached = (revision, sorted(positions[key] for key in stale if key in positions))
            else:
                cached = (revision, [])
            self._stale_at[template.key] = cached
        return cached[1]

    def set_aside(self) -> dict[str, list[str]]:
        """The domains the curriculum draws a tenth as often now: every template of theirs observed enough and
        solved never ("never") or always ("always"); a domain with one template of each is "mixed"."""
        standing = {"never": [], "always": [], "mixed": []}
        if self.curriculum is None:
            return standing
        c = self.curriculum
        for domain in self.domains:
            keys = [t.key for t in domain.templates]
            if not all(key in c.stale_templates for key in keys):
                continue
            solved = {c.template_rates[key] >= c.high for key in keys}
            standing["mixed" if len(solved) > 1 else "always" if solved == {True} else "never"].append(domain.name)
        return standing

    def state(self) -> dict:
        """What a checkpoint keeps so a resumed run draws the same batches (JSON-safe). Taken at every step: it
        copies references to rows that are never changed afterwards, so it costs a millisecond at 50,000 tasks
        observed (sorting and rebuilding them took 200 ms)."""
        version, internal, gauss = self.rng.getstate()
        state = {"rng": [version, list(internal), gauss]}
        if self.curriculum is not None:
            state["curriculum"] = list(self.curriculum.task_rows.values())
            state["template_curriculum"] = list(self.curriculum.template_rows.values())
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
            c.reindex()

"""Agreement between reviewers, per queue and question: Krippendorff's alpha (nominal for pass/fail and label
sets, ordinal for ordinal scales) with a bootstrap confidence interval, pairwise agreement per reviewer pair,
and the items in disagreement (which adjudication settles).

Alpha comes from the `krippendorff` package (its value-count form: one row per item, one column per answer);
the interval resamples items with replacement and recomputes alpha from the resampled rows — the unit of
sampling is the item, since one reviewer's answers on an item are not independent of another's.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import krippendorff
import numpy as np

from .models import Label, ReviewQueue

BOOTSTRAP_SAMPLES = 1000
CONFIDENCE = 0.95


@dataclass
class QuestionAgreement:
    question: str
    level: str  # nominal | ordinal
    items: int  # items with at least two answers (the ones alpha reads)
    answers: int
    alpha: float | None
    low: float | None  # the bootstrap interval
    high: float | None
    note: str = ""  # why alpha is undefined, when it is
    pairwise: list[dict] = field(default_factory=list)  # {a, b, items, agreement}
    disagreements: list[int] = field(default_factory=list)  # item ids with different answers


def _encoded(question: dict, value) -> int | None:
    if question["type"] == "pass_fail":
        return int(bool(value)) if isinstance(value, bool) else None
    return question["labels"].index(value) if value in question["labels"] else None


def alpha_with_interval(value_counts: np.ndarray, *, level: str, seed: int = 0,
                        samples: int = BOOTSTRAP_SAMPLES) -> tuple[float | None, float | None, float | None, str]:
    """(alpha, low, high, note) from an items x values count matrix. Alpha is undefined when fewer than two
    items have two answers, or when every answer is the same value (no expected disagreement)."""
    paired = value_counts[value_counts.sum(axis=1) >= 2]
    if len(paired) < 2:
        return None, None, None, "fewer than two items have two answers"
    if np.count_nonzero(paired.sum(axis=0)) < 2:
        return None, None, None, "every answer is the same: no disagreement to measure against"
    domain = np.arange(paired.shape[1])
    alpha = float(krippendorff.alpha(value_counts=paired, value_domain=domain, level_of_measurement=level))
    rng = np.random.default_rng(seed)
    draws = []
    for _ in range(samples):
        resampled = paired[rng.integers(0, len(paired), len(paired))]
        if np.count_nonzero(resampled.sum(axis=0)) < 2:
            continue  # a resample with a single value has no alpha
        draws.append(krippendorff.alpha(value_counts=resampled, value_domain=domain, level_of_measurement=level))
    if not draws:
        return alpha, None, None, "no resample had two different answers"
    tail = (1 - CONFIDENCE) / 2 * 100
    low, high = np.nanpercentile(draws, [tail, 100 - tail])
    return alpha, float(low), float(high), ""


def queue_agreement(queue: ReviewQueue, *, seed: int = 0, samples: int = BOOTSTRAP_SAMPLES) -> list[QuestionAgreement]:
    """Per question of the queue's rubric that can be compared (not free text), on each reviewer's current
    whole-trajectory label of the items still in the queue."""
    rows = list(Label.objects.whole().current().filter(item__queue=queue, item__removed=False)
                .values_list("item_id", "reviewer_id", "reviewer__username", "answers"))
    names = {reviewer: name for _, reviewer, name, _ in rows}
    results = []
    for question in queue.rubric.spec["questions"]:
        if question.get("scope", "trajectory") != "trajectory" or question["type"] == "text":
            continue
        size = 2 if question["type"] == "pass_fail" else len(question["labels"])
        answers: dict[int, dict[int, int]] = {}  # item -> reviewer -> value
        for item, reviewer, _, given in rows:
            value = _encoded(question, given.get(question["key"]))
            if value is not None:
                answers.setdefault(item, {})[reviewer] = value
        items = sorted(answers)
        counts = np.zeros((len(items), size))
        for row, item in enumerate(items):
            for value in answers[item].values():
                counts[row, value] += 1
        level = "ordinal" if question["type"] == "ordinal" else "nominal"
        alpha, low, high, note = alpha_with_interval(counts, level=level, seed=seed, samples=samples)
        pairwise = []
        for a, b in itertools.combinations(sorted(names, key=names.get), 2):
            shared = [item for item in items if a in answers[item] and b in answers[item]]
            if shared:
                same = sum(answers[item][a] == answers[item][b] for item in shared)
                pairwise.append({"a": names[a], "b": names[b], "items": len(shared),
                                 "agreement": same / len(shared)})
        results.append(QuestionAgreement(
            question=question["key"], level=level, items=int((counts.sum(axis=1) >= 2).sum()),
            answers=int(counts.sum()), alpha=alpha, low=low, high=high, note=note, pairwise=pairwise,
            disagreements=[item for item in items if len(set(answers[item].values())) > 1]))
    return results

"""Judge calibration: for each version of a judge-backed verifier and each judge model in it, the judge's
decisions against the people's gold labels on the same trajectories — agreement, Cohen's kappa with a bootstrap
interval, and the true and false positive rates (the judge's "pass" on answers people accepted, and on answers
they did not).

Gold: an adjudicated answer, else the answer every reviewer gave in their current revision (items where
reviewers differ and nobody decided are left out). The judge's decision: its component's value at 0.5 or above
is a pass. Kappa is the two-by-two formula, written here rather than importing scikit-learn (not a dependency)
for one line of arithmetic; the interval resamples trajectories.

For a pairwise judge (one that compares the answer with a reference in both orders), the card also says how often
its two orders agree on which answer is better, and its position bias: the mean preference for whichever answer
it was shown first, less 0.5 (0 for a judge that ignores position).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from apps.registry.models import Version

from .models import Adjudication, Label
from .services import JUDGE_TYPES


@dataclass
class CalibrationCard:
    version: str  # verifier/slug@N
    model: str  # the judge model
    items: int
    agreement: float | None
    kappa: float | None
    kappa_low: float | None
    kappa_high: float | None
    true_positive_rate: float | None  # judge passes what people accepted
    false_positive_rate: float | None  # judge passes what people did not
    pairwise_items: int = 0  # of `items`, those the judge saw in both orders
    order_consistency: float | None = None  # share of those where both orders prefer the same answer
    position_bias: float | None = None  # mean preference for the answer shown first, less 0.5
    note: str = ""


def cohen_kappa(judge: np.ndarray, gold: np.ndarray) -> float | None:
    """Kappa of two binary raters; None when chance agreement is total (both always say the same one thing)."""
    observed = float(np.mean(judge == gold))
    p_judge, p_gold = float(np.mean(judge)), float(np.mean(gold))
    expected = p_judge * p_gold + (1 - p_judge) * (1 - p_gold)
    return None if expected >= 1 else (observed - expected) / (1 - expected)


def _gold(labels: list, decided, question: str) -> str | None:
    if decided is not None:
        return decided
    answers = {str(label.answers.get(question)) for label in labels if question in label.answers}
    return answers.pop() if len(answers) == 1 else None


def calibration_cards(*, definition, question: str = "verdict", accept: str = "correct", samples: int = 1000,
                      seed: int = 0) -> list[CalibrationCard]:
    """One card per (version, judge model) of the verifier `definition`, over trajectories people labelled."""
    labels = defaultdict(list)
    trajectories = {}
    for label in (Label.objects.whole().current().filter(
                      item__trajectory__verifier__startswith=f"verifier/{definition.slug}@",
                      item__queue__project=definition.project)
                  .select_related("item__trajectory")):
        labels[label.item.trajectory_id].append(label)
        trajectories[label.item.trajectory_id] = label.item.trajectory
    decided = {a.item.trajectory_id: a.answer for a in Adjudication.objects.filter(
        question=question, item__trajectory_id__in=list(trajectories)).select_related("item")}
    pairs = defaultdict(list)  # (version, model) -> [(judge passes, people accept)]
    orders = defaultdict(list)  # (version, model) -> [[preference for the first shown, in each order]]
    models = {}
    for pk, trajectory in trajectories.items():
        gold = _gold(labels[pk], decided.get(pk), question)
        if gold is None:
            continue
        judged = [c for c in (trajectory.verdict or {}).get("components", [])
                  if c.get("type") in JUDGE_TYPES and c.get("value") is not None]
        for component in judged:
            version = trajectory.verifier
            if version not in models:
                models[version] = _judge_models(definition, version)
            model = models[version].get(component.get("name"), component.get("name", "judge"))
            pairs[(version, model)].append((component["value"] >= 0.5, gold == accept))
            if component.get("orders"):
                orders[(version, model)].append(component["orders"])
    rng = np.random.default_rng(seed)
    cards = []
    for (version, model), rows in sorted(pairs.items()):
        judge = np.array([j for j, _ in rows], dtype=float)
        gold = np.array([g for _, g in rows], dtype=float)
        kappa = cohen_kappa(judge, gold)
        draws = []
        for _ in range(samples if kappa is not None else 0):
            pick = rng.integers(0, len(rows), len(rows))
            value = cohen_kappa(judge[pick], gold[pick])
            if value is not None:
                draws.append(value)
        low, high = (float(x) for x in np.percentile(draws, [2.5, 97.5])) if draws else (None, None)
        cards.append(CalibrationCard(
            version=version, model=model, items=len(rows), agreement=float(np.mean(judge == gold)), kappa=kappa,
            kappa_low=low, kappa_high=high,
            true_positive_rate=float(judge[gold == 1].mean()) if (gold == 1).any() else None,
            false_positive_rate=float(judge[gold == 0].mean()) if (gold == 0).any() else None,
            **_order_figures(orders[(version, model)]),
            note="" if kappa is not None else "the judge and the people each gave one answer only: kappa undefined"))
    return cards


def _side(preference: float) -> int:
    return (preference > 0.5) - (preference < 0.5)


def _order_figures(orders: list[list[float]]) -> dict:
    """Consistency and position bias of a pairwise judge over its (shown first, shown second) calls. In the second
    call the reference is shown first, so the answer's preference there is 1 minus the call's."""
    if not orders:
        return {}
    consistent = [_side(first) == _side(1 - second) for first, second in orders]
    return {"pairwise_items": len(orders), "order_consistency": float(np.mean(consistent)),
            "position_bias": float(np.mean([(first + second) / 2 for first, second in orders]) - 0.5)}


def _judge_models(definition, version_ref: str) -> dict[str, str]:
    """Judge check name -> its model, from the verifier version's spec."""
    number = version_ref.rsplit("@", 1)[-1]
    version = Version.objects.filter(definition=definition, number=int(number) if number.isdigit() else 0).first()
    if version is None:
        return {}
    # Component names as workers/verifiers/pipeline.py gives them: the check's name, else type-position.
    return {check.get("name") or f"{check['type']}-{number}": check.get("model", "")
            for layer in version.spec.get("layers", [])
            for number, check in enumerate(layer.get("checks", [])) if check["type"] in JUDGE_TYPES}

"""Eval figures: an evaluation of the demo suite (tasks and answers per second through the real sandboxes and
verifiers, the base model's pretraining done first and not counted), and the leaderboard's statistics over
10,000 paired items (two models' scores with their intervals, the paired comparison per domain with
Benjamini-Hochberg), which the page computes on every view.

The demo content is seeded into the database in use if it is not there (the seed is idempotent).
"""

from __future__ import annotations

import random
import time

from apps.common import wiring
from apps.demo.seed import seed
from apps.evals import results, statistics
from apps.evals.selectors import training_bundle
from apps.evals.services import evaluation_launch
from apps.registry.pins import bundle_tasks
from apps.registry.refs import Ref, parse_ref
from apps.registry.selectors import version_resolve
from apps.runs.attempts import run_attempt
from apps.runs.services import run_claim


def run(*, paired_items: int = 10_000, **_) -> dict:
    out = {"demo_suite": _demo_suite()}
    out["statistics"] = _statistics(paired_items)
    out["targets"] = {"statistics_s": 2}
    out["meets_targets"] = out["statistics"]["seconds"] < 2
    return out


def _demo_suite() -> dict:
    project = seed().project
    suite = version_resolve(project=project, ref=Ref("bundle", "demo-suite"))
    model = version_resolve(project=project, ref=parse_ref("model/demo-tiny"))
    began = time.perf_counter()
    # Pretrained once per data directory, from the tasks of the bundle the demo run trains on (as the evaluation
    # builds it), not the suite's held-out ones.
    trains = training_bundle(suite=suite, model=model) or suite
    wiring.demo_base_model(bundle_tasks(bundle=trains))
    pretrain_s = time.perf_counter() - began
    evaluation = evaluation_launch(project=project, suite=suite, actor=None, model=model, via="cli")
    began = time.perf_counter()
    run_attempt(run_id=evaluation.run_id, attempt=run_claim(run_id=evaluation.run_id, stale_after=0))
    seconds = time.perf_counter() - began
    evaluation.refresh_from_db()
    [row] = results.leaderboard([evaluation]).rows
    overall = row.scores[results.ALL]
    answers = overall.samples + row.infra_errors
    return {"evaluation": evaluation.pk, "status": evaluation.run.status, "tasks": overall.tasks, "answers": answers,
            "seconds": round(seconds, 1), "tasks_per_s": round(overall.tasks / seconds, 2),
            "pretrain_s": round(pretrain_s, 1), "score": overall.mean, "interval": [overall.low, overall.high],
            "infra_errors": row.infra_errors,
            "by_domain": {d: round(s.mean, 3) for d, s in row.scores.items() if s.mean is not None}}


def _statistics(items: int) -> dict:
    """Two models over `items` tasks in five domains (b better by about 0.05 in one of them), scored and compared
    as the leaderboard and the comparison page do."""
    rng = random.Random(0)
    domains = ["arithmetic", "word-problems", "python-coding", "document-qa", "3d-modelling"]
    a: dict[str, dict[str, list[float]]] = {d: {} for d in domains}
    b: dict[str, dict[str, list[float]]] = {d: {} for d in domains}
    for index in range(items):
        domain = domains[index % len(domains)]
        skill = rng.random()
        a[domain][f"t{index}"] = [float(skill < 0.6)]
        b[domain][f"t{index}"] = [float(skill < (0.65 if domain == "arithmetic" else 0.6))]
    began = time.perf_counter()
    for side in (a, b):
        for domain in domains:
            statistics.score(side[domain])
        statistics.score({task: r for tasks in side.values() for task, r in tasks.items()})
    compared = statistics.adjust({d: statistics.compare(a[d], b[d]) for d in domains})
    seconds = time.perf_counter() - began
    return {"items": items, "seconds": round(seconds, 3),
            "significant": sorted(d for d, c in compared.items() if c.significant),
            "arithmetic_difference": round(compared["arithmetic"].difference, 4)}

"""Results both ways with lm-evaluation-harness: an evaluation's per-task results out as JSONL and as the harness's
results JSON, and a results file of the harness read in (its scores and the key parts of an external evaluation:
services.external_import publishes it, selectors.external_groups reads them back).

lm-evaluation-harness writes `results_<date>.json`: `results` (per task, metrics named `metric,filter` with their
`metric_stderr,filter`), `versions`, `n-shot`, `configs` (each task's YAML config), `higher_is_better`,
`n-samples`, `config` (the model and its settings), and, asked with --log_samples, one `samples_<task>_<date>.jsonl`
per task (a row per document: doc_id, doc, target, arguments, resps, filtered_resps, metrics and each metric's
value). Both directions keep that shape, so a file the harness wrote imports here and a file written here reads in
whatever reads the harness's.

An imported file is an **external** evaluation: its tasks are the harness's, not a suite's pinned closure, so its
comparability key hashes what the file says it ran (per task: version, few-shot count, documents evaluated, and the
task's config without its `metadata`, which names the model) and it is never ranked against the studio's suites.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterator
from datetime import datetime

from apps.common.errors import StudioError
from apps.trajectories.models import Trajectory

from . import results
from .models import Evaluation

HARNESS = "lm-evaluation-harness"
METRIC = "reward"  # what the studio's export calls its score: the mean verifier reward (accuracy for pass/fail)
FILTER = "none"
MAX_TASKS = 2000
MAX_NAME = 200


class ResultsRefused(StudioError, ValueError):
    """A results file that is not lm-evaluation-harness's shape, said as what is wrong and where."""

    def __init__(self, message: str, *, field: str = "results"):
        super().__init__(message, field=field)


# --- out ---------------------------------------------------------------------------------------------------------

def _template(reference: str) -> tuple[str, str]:
    """("gsm8k", "3") from "task_template/gsm8k@3"."""
    slug, _, number = reference.partition("/")[2].partition("@")
    return slug, number


def _prompt(turns: list[dict]) -> str:
    """What the model was asked: the turns before its first answer."""
    before = []
    for turn in turns:
        if turn.get("role") == "assistant":
            break
        before.append(turn.get("content", ""))
    return "\n".join(before)


def _response(turns: list[dict]) -> str:
    return next((t.get("content", "") for t in reversed(turns) if t.get("role") == "assistant"), "")


def _trajectories(evaluation: Evaluation):
    return (Trajectory.objects.filter(run_id=evaluation.run_id).order_by("seq", "sample")
            .values("id", "domain", "template", "task_key", "sample", "status", "reward", "verdict_status",
                    "turns", "cost").iterator(chunk_size=500))


def result_rows(evaluation: Evaluation) -> Iterator[dict]:
    """One row per answer, in the order they were drawn: what was evaluated, the task, the sample, its reward
    (None: the infrastructure failed, never a wrong answer), the answer itself and its trajectory."""
    for row in _trajectories(evaluation):
        slug, number = _template(row["template"])
        yield {"evaluation": evaluation.pk, "what": evaluation.label, "suite": evaluation.suite.ref,
               "key": evaluation.key, "domain": row["domain"], "template": slug, "template_version": number,
               "task": row["task_key"], "sample": row["sample"], "reward": row["reward"], "status": row["status"],
               "verdict": row["verdict_status"], "prompt": _prompt(row["turns"]), "response": _response(row["turns"]),
               "cost": row["cost"], "trajectory": str(row["id"])}


def result_jsonl(evaluation: Evaluation) -> Iterator[str]:
    for row in result_rows(evaluation):
        yield json.dumps(row, ensure_ascii=False) + "\n"


def _digest(value) -> str:
    return hashlib.sha256((value if isinstance(value, str) else json.dumps(value, sort_keys=True)).encode()).hexdigest()


def _stderr(values: list[float]) -> float | str:
    """The standard error of the mean, as the harness reports it (N/A under two values)."""
    if len(values) < 2:
        return "N/A"
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1) / len(values))


def lm_eval_results(evaluation: Evaluation) -> dict:
    """The evaluation as lm-evaluation-harness's results JSON, one task per task template (its per-task mean of the
    samples' rewards as `reward,none`, with its standard error), the domains as groups, and `samples` as the
    harness returns them with --log_samples (the command writes them to their own files)."""
    settings = evaluation.key_parts.get("settings", {})
    by_task: dict[str, dict[str, list]] = {}
    versions, domains = {}, {}
    for row in result_rows(evaluation):
        versions[row["template"]] = row["template_version"]
        domains.setdefault(row["domain"], set()).add(row["template"])
        sample = by_task.setdefault(row["template"], {}).setdefault(row["task"], [])
        sample.append(row)
    outcome, configs, samples = {}, {}, {}
    for task, documents in sorted(by_task.items()):
        graded = {key: [r["reward"] for r in rows if r["reward"] is not None] for key, rows in documents.items()}
        means = [sum(values) / len(values) for values in graded.values() if values]
        outcome[task] = {"alias": task, f"{METRIC},{FILTER}": sum(means) / len(means) if means else None,
                         f"{METRIC}_stderr,{FILTER}": _stderr(means), "sample_len": len(documents)}
        configs[task] = {"task": task, "dataset_path": f"posttrain-studio:{evaluation.suite.ref}",
                         "output_type": "generate_until", "num_fewshot": 0,
                         "repeats": settings.get("samples_per_task", 1),
                         "generation_kwargs": {"temperature": settings.get("temperature", 0.0)},
                         "metric_list": [{"metric": METRIC, "aggregation": "mean", "higher_is_better": True}],
                         "metadata": {"version": versions[task], "suite_key": evaluation.key}}
        samples[task] = [_sample(index, key, rows) for index, (key, rows) in enumerate(documents.items())]
    board = results.leaderboard([evaluation]).rows[0].scores
    groups = {domain: {"alias": domain, f"{METRIC},{FILTER}": board[domain].mean,
                       f"{METRIC}_stderr,{FILTER}": "N/A", "sample_len": board[domain].tasks}
              for domain in sorted(domains) if domain in board}
    return {"results": outcome, "groups": groups,
            "group_subtasks": {domain: sorted(tasks) for domain, tasks in sorted(domains.items())},
            "configs": configs, "versions": versions, "n-shot": dict.fromkeys(outcome, 0),
            "higher_is_better": {task: {METRIC: True} for task in outcome},
            "n-samples": {task: {"original": len(by_task[task]), "effective": len(by_task[task])} for task in outcome},
            "config": {"model": "posttrain-studio", "model_args": evaluation.label, "batch_size": None,
                       "limit": None, "gen_kwargs": {"temperature": settings.get("temperature", 0.0)},
                       "random_seed": settings.get("seed", 0)},
            "model_name": evaluation.label, "model_source": "posttrain-studio",
            "date": evaluation.created_at.timestamp(), "samples": samples}


def _sample(index: int, key: str, rows: list[dict]) -> dict:
    """A document's row of the harness's samples file; the studio's task key is its `doc.key` (doc_id is the
    document's place in the task, as the harness numbers them)."""
    first = rows[0]
    graded = [r["reward"] for r in rows if r["reward"] is not None]
    responses = [r["response"] for r in rows]
    return {"doc_id": int(key) if key.isdigit() else index, "doc": {"key": key, "domain": first["domain"]},
            "target": "", "arguments": {"gen_args_0": {"arg_0": first["prompt"], "arg_1": {}}},
            "resps": [responses], "filtered_resps": responses, "filter": FILTER, "metrics": [METRIC],
            METRIC: sum(graded) / len(graded) if graded else None, "trajectories": [r["trajectory"] for r in rows],
            "doc_hash": _digest({"key": key}), "prompt_hash": _digest(first["prompt"]), "target_hash": _digest("")}


# --- in ----------------------------------------------------------------------------------------------------------

def _number(value) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def read_results(document) -> tuple[dict, dict]:
    """(scores, key parts) of an lm-evaluation-harness results file; ResultsRefused naming what is wrong."""
    if not isinstance(document, dict) or not isinstance(document.get("results"), dict) or not document["results"]:
        raise ResultsRefused("not an lm-evaluation-harness results file: it has no `results` object of tasks")
    if len(document["results"]) > MAX_TASKS:
        raise ResultsRefused(f"more than {MAX_TASKS} tasks")
    sections = {name: document.get(name) or {} for name in ("versions", "n-shot", "configs", "n-samples")}
    for name, section in sections.items():
        if not isinstance(section, dict):
            raise ResultsRefused(f"`{name}` must be an object keyed by task")
    scores, parts = {}, {}
    for task, metrics in document["results"].items():
        if not isinstance(task, str) or not task or len(task) > MAX_NAME:
            raise ResultsRefused(f"a task name must be text of 1 to {MAX_NAME} characters: {str(task)[:60]!r}")
        if not isinstance(metrics, dict):
            raise ResultsRefused(f"results.{task} must be an object of metrics")
        found = {}
        for name, value in metrics.items():
            metric, comma, filter_name = str(name).partition(",")
            if not comma or metric.endswith("_stderr"):
                continue
            number = _number(value)
            if number is None and value is not None:
                raise ResultsRefused(f"results.{task}.{name} must be a number, not {str(value)[:40]!r}")
            stderr = _number(metrics.get(f"{metric}_stderr,{filter_name}"))
            found[str(name)[:MAX_NAME]] = {"value": number, "stderr": stderr}
        if not found:
            raise ResultsRefused(f"results.{task} has no metric (names like `acc,none`)")
        scores[task] = found
        config = sections["configs"].get(task)
        config = {k: v for k, v in config.items() if k != "metadata"} if isinstance(config, dict) else None
        samples = sections["n-samples"].get(task)
        parts[task] = {"version": sections["versions"].get(task), "n-shot": sections["n-shot"].get(task),
                       "documents": samples.get("effective") if isinstance(samples, dict) else None,
                       "config": _digest(config) if config is not None else None}
    return scores, parts


def external_key(parts: dict) -> str:
    return hashlib.sha256(json.dumps({"harness": HARNESS, "tasks": parts}, sort_keys=True,
                                     separators=(",", ":")).encode()).hexdigest()


def write_lm_eval(evaluation: Evaluation, directory) -> list:
    """The harness's files in `directory`: results_<date>.json and samples_<task>_<date>.jsonl per task."""
    document = lm_eval_results(evaluation)
    samples = document.pop("samples")
    stamp = datetime.fromtimestamp(document["date"]).strftime("%Y-%m-%dT%H-%M-%S")
    directory.mkdir(parents=True, exist_ok=True)
    written = [directory / f"results_{stamp}.json"]
    written[0].write_text(json.dumps(document, indent=2, ensure_ascii=False), encoding="utf-8")
    for task, rows in samples.items():
        path = directory / f"samples_{task}_{stamp}.jsonl"
        path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows), encoding="utf-8")
        written.append(path)
    return written

"""The rows each kind of source gives (DatasetSpec's sources, workers/definitions/specs.py), each with its
provenance. Read in a fixed order, so the same archive gives the same rows in the same order, and the same hash.

Each row also says, outside its provenance, which task it answers (`_task`, template slug / task key, or None
for an uploaded row): the build leaves out the eval suites' tasks by it, then drops the key.
"""

from __future__ import annotations

from django.http import Http404

from apps.accounts.models import Project
from apps.registry.dataset_store import jsonl_read, upload_key
from apps.review.exports import conversation, dataset_rows, offered_tools, with_tools
from apps.review.selectors import queue_get
from apps.runs.checkpoints import CheckpointNotFound, run_find
from apps.runs.models import Run, RunKind, RunStatus
from apps.trajectories.models import Trajectory
from apps.trajectories.selectors import BadFilter, trajectory_filter
from workers.rl.tasks.overlap import task_label

from .errors import DatasetError
from .rows import rows_parsed

TASK = "_task"  # the task a row answers, read by the build and dropped before the row is written


def _trajectory_provenance(trajectory: Trajectory, source: str) -> dict:
    return {"source": source, "trajectory": str(trajectory.pk), "run": str(trajectory.run_id),
            "run_name": trajectory.run.name, "template": trajectory.template, "task_key": trajectory.task_key,
            "verifier": trajectory.verifier, "policy_version": trajectory.policy_version,
            "reward": trajectory.reward, "verdict_status": trajectory.verdict_status,
            "deciding_layer": trajectory.deciding_layer}


def _queue(project: Project, slug: str, field: str):
    try:
        return queue_get(project=project, slug=slug)
    except Http404 as exc:
        raise DatasetError(str(exc), field=field, status=404) from None


def trajectory_rows(project: Project, source: dict, field: str) -> list[dict]:
    filters = {name: source[name] for name in ("domain", "verdict_status", "deciding_layer") if source[name]}
    if source["reward_min"] is not None:
        filters["reward_min"] = source["reward_min"]
    if source["run"]:
        try:
            filters["run"] = str(run_find(project=project, name=source["run"]).pk)
        except CheckpointNotFound as exc:
            raise DatasetError(str(exc), field=f"{field}.run", status=404) from None
    try:
        selected = trajectory_filter(project=project, filters=filters)
    except BadFilter as exc:
        raise DatasetError(str(exc), field=f"{field}.{exc.field}") from None
    reviews = {}
    if source["accepted_in"]:
        # What the queue's reviewers accepted (or its adjudicator decided), with their labels: review's own rule.
        queue = _queue(project, source["accepted_in"], f"{field}.accepted_in")
        reviews = {row["provenance"]["trajectory"]: row["provenance"] for row in
                   dataset_rows(queue, kind="sft", question=source["question"], accept=source["accept"])}
        selected = selected.filter(pk__in=list(reviews))
    rows = []
    trajectories = list(selected.select_related("run").order_by("-finished_at", "id")[:source["limit"]])
    tools = offered_tools(trajectories)
    for trajectory in trajectories:
        provenance = _trajectory_provenance(trajectory, "trajectories")
        if reviews:
            review = reviews[str(trajectory.pk)]
            provenance["review"] = {key: review[key] for key in ("queue", "labels", "reviewers", "gold",
                                                                 "agreement_alpha")}
        rows.append(with_tools({"messages": conversation(trajectory), "provenance": provenance,
                                TASK: task_label(trajectory.template, trajectory.task_key)}, trajectory, tools))
    return rows


def review_pair_rows(project: Project, source: dict, field: str) -> list[dict]:
    queue = _queue(project, source["queue"], f"{field}.queue")
    pairs = dataset_rows(queue, kind="preference", question=source["question"], accept=source["accept"])
    chosen = {pair["provenance"]["chosen"]["trajectory"] for pair in pairs}
    tasks = {str(pk): task_label(template, key) for pk, template, key in
             Trajectory.objects.filter(pk__in=chosen).values_list("pk", "template", "task_key")}
    return [{**pair, "provenance": {"source": "review_pairs", **pair["provenance"]},
             TASK: tasks[pair["provenance"]["chosen"]["trajectory"]]} for pair in pairs]


def reference_check_rows(project: Project, source: dict, field: str) -> list[dict]:
    run = (Run.objects.filter(project=project, kind=RunKind.REFERENCE, status=RunStatus.COMPLETED,
                              bundle__definition__slug=source["bundle"])
           .select_related("bundle__definition").order_by("-created_at").first())
    if run is None:
        raise DatasetError(f"bundle {source['bundle']} has no completed reference check; run manage.py "
                           f"reference_check --bundle {source['bundle']} first", field=f"{field}.bundle", status=404)
    selected = Trajectory.objects.filter(run=run)
    if source["passed_only"]:
        selected = selected.filter(verdict_status="pass")
    if source["tool_calls_only"]:
        selected = selected.filter(num_tool_calls__gt=0)
    if source["template"]:
        selected = selected.filter(template__startswith=f"task_template/{source['template']}@")
    rows = []
    trajectories = list(selected.select_related("run").order_by("seq", "sample"))
    tools = offered_tools(trajectories)
    for trajectory in trajectories:
        provenance = {**_trajectory_provenance(trajectory, "reference_check"), "bundle": run.bundle.ref}
        rows.append(with_tools({"messages": conversation(trajectory), "provenance": provenance,
                                TASK: task_label(trajectory.template, trajectory.task_key)}, trajectory, tools))
    return rows


def upload_rows(project: Project, source: dict, field: str, *, fmt: str) -> list[dict]:
    try:
        content = jsonl_read(source["sha256"], key_of=upload_key)
    except LookupError as exc:
        raise DatasetError(str(exc), field=f"{field}.sha256", status=404) from None
    rows = []
    for line, row in enumerate(rows_parsed(content, fmt=fmt), start=1):
        provenance = {"source": "upload", "file": source["name"], "sha256": source["sha256"], "line": line}
        if row.get("provenance"):
            provenance["upstream"] = row["provenance"]  # what the file said of the row, kept as it was
        rows.append({**row, "provenance": provenance, TASK: None})
    return rows


def source_rows(project: Project, source: dict, *, position: int, fmt: str) -> list[dict]:
    field = f"sources[{position}]"
    if source["type"] == "trajectories":
        return trajectory_rows(project, source, field)
    if source["type"] == "review_pairs":
        return review_pair_rows(project, source, field)
    if source["type"] == "reference_check":
        return reference_check_rows(project, source, field)
    return upload_rows(project, source, field, fmt=fmt)

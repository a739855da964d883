"""Reads for the eval pages and API: suites, evaluations, and a run's checkpoints on a suite over time."""

from __future__ import annotations

from django.db.models import QuerySet
from django.http import Http404

from apps.accounts.models import Project
from apps.registry.models import Version
from apps.registry.pins import bundle_tasks
from apps.registry.refs import split_slug_ref
from apps.runs.models import Checkpoint, CheckpointAlias, MetricPoint
from apps.runs.stages import lineage
from workers.rl.rollout.evaluation import suite_tasks
from workers.rl.tasks.overlap import task_id

from . import results, statistics
from .models import Endpoint, Evaluation, ExternalEvaluation
from .suites import suite_settings


def suite_list(*, project: Project) -> QuerySet[Version]:
    """Every bundle version marked for evaluation, newest first."""
    return (Version.objects.filter(definition__project=project, definition__kind="bundle",
                                   spec__has_key="evaluation")
            .select_related("definition").order_by("definition__slug", "-number"))


def suite_get(*, project: Project, slug: str, number: int | None = None) -> Version:
    versions = suite_list(project=project).filter(definition__slug=slug)
    suite = versions.filter(number=number).first() if number else versions.first()
    if suite is None:
        raise Http404(f"no eval suite {slug}{'@' + str(number) if number else ''} in project {project.slug}")
    return suite


def training_bundle(*, suite: Version, model: Version) -> Version | None:
    """The newest bundle version of the suite's project whose runs train `model` and are evaluated on `suite` (its
    run_config names both), or None."""
    bundles = (Version.objects.filter(definition__project_id=suite.definition.project_id, definition__kind="bundle",
                                      spec__run_config__has_key="eval_suite")
               .select_related("definition").order_by("-created_at", "-pk"))
    return next((bundle for bundle in bundles if bundle.spec["run_config"].get("model") == model.ref
                 and split_slug_ref(bundle.spec["run_config"]["eval_suite"])[0] == suite.definition.slug), None)


def suite_task_list(*, project: Project) -> list:
    """Every task an eval suite of the project asks (workers.rl.types.Task, one per suite that asks it)."""
    found = []
    for suite in suite_list(project=project):
        settings = suite_settings(suite)
        found += suite_tasks(bundle_tasks(bundle=suite), per_template=settings["tasks_per_template"],
                             seed=settings["seed"])
    return found


def suite_task_ids(*, project: Project) -> frozenset[str]:
    """Every task an eval suite of the project asks (template slug / task key): what review datasets leave out."""
    return frozenset(task_id(task) for task in suite_task_list(project=project))


def evaluation_list(*, project: Project) -> QuerySet[Evaluation]:
    return (Evaluation.objects.filter(project=project)
            .select_related("run", "suite__definition", "endpoint", "model_version__definition", "source_run"))


def evaluation_get(*, project: Project, pk: int) -> Evaluation:
    found = evaluation_list(project=project).filter(pk=pk).first()
    if found is None:
        raise Http404(f"no evaluation {pk} in project {project.slug}")
    return found


def endpoint_list(*, project: Project) -> QuerySet[Endpoint]:
    return Endpoint.objects.filter(project=project).select_related("project").order_by("slug")


def checkpoint_rows(*, project: Project, limit: int = 500) -> list[dict]:
    """Checkpoints newest run first: the run, step, size, aliases, reward/mean at the step, evaluations of it, and
    the checkpoints its run descends from (lineage: the run it started from, that run's, ...)."""
    checkpoints = list(Checkpoint.objects.filter(run__project=project).select_related("run")
                       .order_by("-run__created_at", "-step")[:limit])
    aliases: dict[int, list[str]] = {}
    for alias in CheckpointAlias.objects.filter(project=project):
        aliases.setdefault(alias.checkpoint_id, []).append(alias.name)
    rewards = {(p.run_id, p.step): p.value for p in MetricPoint.objects.filter(
        run_id__in={c.run_id for c in checkpoints}, name="reward/mean",
        step__in={c.step for c in checkpoints})}
    evaluated: dict[int, list[Evaluation]] = {}
    for evaluation in Evaluation.objects.filter(checkpoint__in=checkpoints).select_related("suite__definition", "run"):
        evaluated.setdefault(evaluation.checkpoint_id, []).append(evaluation)
    lineages = {run.pk: lineage(run) for run in {c.run for c in checkpoints}}
    return [{"checkpoint": c, "aliases": sorted(aliases.get(c.pk, [])), "reward": rewards.get((c.run_id, c.step)),
             "evaluations": evaluated.get(c.pk, []), "lineage": lineages[c.run_id]} for c in checkpoints]


def timeline(*, board: results.Leaderboard) -> dict[str, list[tuple[int, statistics.Score]]]:
    """Per training run, its evaluated checkpoints in step order, each with its overall score (read from the
    leaderboard's rows: no second pass over the trajectories)."""
    lines: dict[str, list[tuple[int, statistics.Score]]] = {}
    for row in board.rows:
        evaluation = row.evaluation
        if evaluation.source_run_id is None or evaluation.checkpoint_step is None:
            continue
        lines.setdefault(evaluation.source_run.name, []).append((evaluation.checkpoint_step, row.scores[results.ALL]))
    return {name: sorted(points, key=lambda p: p[0]) for name, points in lines.items()}


def external_groups(*, project: Project) -> list[dict]:
    """The project's external evaluations by comparability key, newest key first: each group's tasks and metrics
    (the columns) and its rows. Groups are never merged with each other or with the studio's suites."""
    groups: dict[str, dict] = {}
    for external in ExternalEvaluation.objects.filter(project=project).order_by("-created_at")[:500]:
        group = groups.setdefault(external.key, {"key": external.key, "harness": external.harness,
                                                 "columns": {}, "rows": []})
        for task, metrics in external.scores.items():
            for metric in metrics:
                group["columns"].setdefault((task, metric), None)
        group["rows"].append(external)
    for group in groups.values():
        group["columns"] = sorted(group["columns"])
        group["table"] = [(row, [row.scores.get(task, {}).get(metric) for task, metric in group["columns"]])
                          for row in group["rows"]]
    return list(groups.values())

"""The evals API: suites, evaluations (launch, status, scores), paired comparisons, endpoints, and the
checkpoint registry's aliases. Readers read; editors launch, add endpoints and move aliases."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.http import StreamingHttpResponse
from ninja import Field, Router, Schema, Status
from pydantic import ConfigDict

from apps.accounts.api_auth import caller_project
from apps.accounts.models import Role
from apps.common.api_errors import READ_ERRORS, WRITE_ERRORS
from apps.registry.errors import VersionNotFound
from apps.registry.refs import Ref, split_slug_ref
from apps.registry.selectors import version_resolve
from apps.runs.checkpoints import CheckpointNotFound, alias_move, checkpoint_resolve
from apps.runs.models import Checkpoint, CheckpointAlias

from . import external, results, selectors
from .services import (
    EvalError,
    endpoint_create,
    endpoint_credential_set,
    endpoint_problem,
    evaluation_launch,
    external_import,
    target_resolve,
)
from .suites import suite_key

router = Router(tags=["evals"])

EVALS = "/projects/{project}/evals"
SLUG = r"^[a-z0-9][a-z0-9-]{0,62}$"


class SuiteOut(Schema):
    ref: str
    key: str
    settings: dict[str, Any]
    pinned: dict[str, Any]


class ScoreOut(Schema):
    score: float | None
    low: float | None
    high: float | None
    tasks: int
    samples: int
    method: str
    pass_at_k: dict[int, float]
    pass_hat_k: dict[int, float]


class EvaluationOut(Schema):
    id: int
    what: str
    kind: str
    suite: str
    key: str
    run: str
    status: str
    batches_done: int
    batches: int
    created_at: datetime


class EvaluationDetailOut(EvaluationOut):
    infra_errors: int
    cost: float
    scores: dict[str, ScoreOut]


class EvaluationIn(Schema):
    model_config = ConfigDict(extra="forbid")

    suite: str = Field(description="an eval suite: bundle slug, slug@N or slug@alias")
    model: str | None = Field(None, description="a model definition, model/SLUG[@N]")
    checkpoint: str | None = Field(None, description="RUN@STEP (a run's name or id; STEP a number or latest) or "
                                                     "a checkpoint alias")
    endpoint: str | None = Field(None, description="an endpoint's slug")
    trained_by: str | None = Field(None, max_length=200,
                                   description="for a model definition or an endpoint: the run trained elsewhere "
                                               "(kind external; its name or id) that trained the model, so the "
                                               "leaderboard scores apart the suite's tasks its bundle holds")


class ComparisonOut(Schema):
    domain: str
    tasks: int
    difference: float | None
    low: float | None
    high: float | None
    a_only: int
    b_only: int
    p_value: float | None
    q_value: float | None
    significant: bool
    verdict: str = Field(description="b better, b worse (significant at q < 0.05), no significant difference, "
                                     "or no shared tasks")


class TaskChangeOut(Schema):
    task: str
    domain: str
    a: float | None = Field(description="a's mean reward on the task")
    b: float | None = Field(description="b's mean reward on the task")
    change: float = Field(description="b − a (a side without a graded answer counts 0)")
    a_trajectory: str | None
    b_trajectory: str | None


class CompareOut(Schema):
    a: int
    b: int
    a_what: str = Field(description="what evaluation a evaluated (a model, RUN@STEP or an endpoint)")
    b_what: str = Field(description="what evaluation b evaluated")
    domains: list[ComparisonOut] = Field(description="per domain and `all`: difference b − a; a_only and b_only "
                                                     "count the tasks only that side passed")
    regressions: list[TaskChangeOut] = Field(description="tasks where b scores lower than a, largest fall first")
    improvements: list[TaskChangeOut] = Field(description="tasks where b scores higher than a, largest rise first")


class EndpointIn(Schema):
    model_config = ConfigDict(extra="forbid")

    slug: str = Field(pattern=SLUG)
    base_url: str = Field(max_length=500, pattern=r"^https?://[^\s/]+",
                          description="e.g. https://api.example.com/v1; a public address, or one the operator "
                                      "allowed (STUDIO_EGRESS_ALLOW)")
    model: str = Field(min_length=1, max_length=200, description="the model name the server knows")
    credential: str = Field("", max_length=80, description="the API key's credential, one of GET /projects/"
                                                           "{project}/credentials (operator:NAME, project:NAME); "
                                                           "empty: none")
    api_key_env: str = Field("", max_length=100, description="the older way: only STUDIO_ENDPOINT_KEY_<NAME> "
                                                             "(taken as operator:<NAME>); any other is refused")


class EndpointCredentialIn(Schema):
    model_config = ConfigDict(extra="forbid")

    credential: str = Field(max_length=80, description="one of GET /projects/{project}/credentials, or empty")


class EndpointOut(Schema):
    slug: str
    base_url: str
    model: str
    credential: str
    problem: str = Field(description="why it cannot be evaluated as it is, and what to do; empty when it can")


class CheckpointOut(Schema):
    run: str
    run_name: str
    step: int
    bytes: int
    aliases: list[str]
    created_at: datetime


class AliasIn(Schema):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=SLUG)
    checkpoint: str = Field(description="RUN@STEP")


def _evaluation(e) -> dict:
    return {"id": e.pk, "what": e.label, "kind": e.kind, "suite": e.suite.ref, "key": e.key, "run": str(e.run_id),
            "status": e.run.status, "batches_done": e.run.step, "batches": e.run.steps_total,
            "created_at": e.created_at}


def _change(c: results.TaskChange) -> dict:
    return {**vars(c), "change": c.change}


def _score(s) -> dict:
    return {"score": s.mean, "low": s.low, "high": s.high, "tasks": s.tasks, "samples": s.samples,
            "method": s.method, "pass_at_k": s.pass_at_k, "pass_hat_k": s.pass_hat_k}


@router.get(EVALS + "/suites", response={200: list[SuiteOut], **READ_ERRORS})
def list_suites(request, project: str):
    """Every bundle version marked for evaluation, with its comparability key and what the key pins."""
    out = []
    for version in selectors.suite_list(project=caller_project(request, project)):
        key, parts = suite_key(version)
        out.append({"ref": version.ref, "key": key, "settings": parts["settings"], "pinned": parts["pinned"]})
    return out


@router.get(EVALS, response={200: list[EvaluationOut], **READ_ERRORS})
def list_evaluations(request, project: str):
    return [_evaluation(e) for e in selectors.evaluation_list(project=caller_project(request, project))[:500]]


@router.post(EVALS, response={201: EvaluationOut, **WRITE_ERRORS})
def launch_evaluation(request, project: str, payload: EvaluationIn):
    """Queue an evaluation of one model (a model definition, a checkpoint or an endpoint) on a suite (editors)."""
    scope = caller_project(request, project, min_role=Role.EDITOR)
    named = next((name for name in ("model", "checkpoint", "endpoint") if getattr(payload, name)), "model")
    try:
        suite = version_resolve(project=scope, ref=Ref("bundle", *split_slug_ref(payload.suite)))
        target = target_resolve(project=scope, model=payload.model, checkpoint=payload.checkpoint,
                                endpoint=payload.endpoint, trained_by=payload.trained_by)
        evaluation = evaluation_launch(project=scope, suite=suite, actor=request.auth, via="api", **target)
    except (VersionNotFound, CheckpointNotFound) as exc:
        raise exc.about(named)
    except EvalError:
        raise
    except ValueError as exc:  # a malformed reference, or a run the evaluation cannot be
        raise EvalError(str(exc), field=named) from None
    return Status(201, _evaluation(evaluation))


@router.get(EVALS + "/{evaluation}", response={200: EvaluationDetailOut, **READ_ERRORS})
def get_evaluation(request, project: str, evaluation: int):
    """An evaluation's status and its scores per domain (and `all`), each with its 95% interval."""
    found = selectors.evaluation_get(project=caller_project(request, project), pk=evaluation)
    [row] = results.leaderboard([found]).rows
    return {**_evaluation(found), "infra_errors": row.infra_errors, "cost": row.cost,
            "scores": {domain: _score(s) for domain, s in row.scores.items()}}


@router.get(EVALS + "/{a}/compare/{b}", response={200: CompareOut, **READ_ERRORS, 409: dict})
def compare_evaluations(request, project: str, a: int, b: int):
    """b compared with a, paired by task: every difference is b − a (above zero where b scores higher), per
    domain with a paired-bootstrap interval, McNemar's exact p and Benjamini-Hochberg q; regressions are the tasks
    b scores lower on than a, improvements those it scores higher on. 409 when the suites' keys differ (the
    message names what differs)."""
    scope = caller_project(request, project)
    left, right = selectors.evaluation_get(project=scope, pk=a), selectors.evaluation_get(project=scope, pk=b)
    paired = results.compare(left, right)  # NotComparable: 409, naming what differs
    regressions, improvements = results.task_diff(left, right)
    domains = [{"domain": d, "tasks": c.tasks, "difference": c.difference, "low": c.low, "high": c.high,
                "a_only": c.a_only, "b_only": c.b_only, "p_value": c.p_value, "q_value": c.q_value,
                "significant": c.significant, "verdict": c.verdict} for d, c in paired.by_domain.items()]
    return {"a": a, "b": b, "a_what": left.label, "b_what": right.label, "domains": domains,
            "regressions": [_change(c) for c in regressions], "improvements": [_change(c) for c in improvements]}


class ExternalIn(Schema):
    model_config = ConfigDict(extra="forbid")

    label: str = Field("", max_length=200, description="the model, as the leaderboard names it (default: the "
                                                        "file's model_name)")
    results: dict[str, Any] = Field(description="lm-evaluation-harness's results JSON (results_<date>.json) as "
                                                "it wrote it; its `samples`, if any, are not kept")


class ExternalOut(Schema):
    id: int
    what: str
    external: bool = Field(True, description="always true: scored by another harness, never ranked against the "
                                             "studio's suites")
    harness: str
    harness_version: str
    model_name: str
    key: str = Field(description="the external comparability key: the tasks with their versions, few-shot counts, "
                                 "configs and documents")
    scores: dict[str, dict[str, dict[str, float | None]]] = Field(
        description="task -> metric as the harness names it (`acc,none`) -> value and stderr")
    created_at: datetime


def _external(row) -> dict:
    return {"id": row.pk, "what": row.label, "external": True, "harness": row.harness,
            "harness_version": row.harness_version, "model_name": row.model_name, "key": row.key,
            "scores": row.scores, "created_at": row.created_at}


@router.get(EVALS + "/external/", response={200: list[ExternalOut], **READ_ERRORS})
def list_external(request, project: str):
    """External evaluations (imported lm-evaluation-harness results), newest first."""
    scope = caller_project(request, project)
    return [_external(row) for group in selectors.external_groups(project=scope) for row in group["rows"]]


@router.post(EVALS + "/external/", response={201: ExternalOut, **WRITE_ERRORS})
def import_external(request, project: str, payload: ExternalIn):
    """Import an lm-evaluation-harness results file for a model as an external evaluation (editors): shown beside
    the studio's evaluations under its own comparability key, never ranked against a suite."""
    scope = caller_project(request, project, min_role=Role.EDITOR)
    row = external_import(project=scope, document=payload.results, label=payload.label,
                                   actor=request.auth, via="api")
    return Status(201, _external(row))


@router.get(EVALS + "/{evaluation}/results", response={200: dict, **READ_ERRORS})
def evaluation_results(request, project: str, evaluation: int, format: str = "lm-eval"):
    """An evaluation's per-task results: `format=lm-eval` (default) lm-evaluation-harness's results JSON with its
    `samples`; `format=jsonl` a row per answer (task, sample, reward, status, prompt, response, trajectory)."""
    found = selectors.evaluation_get(project=caller_project(request, project), pk=evaluation)
    if format == "jsonl":
        return StreamingHttpResponse(external.result_jsonl(found), content_type="application/x-ndjson")
    if format != "lm-eval":
        raise external.ResultsRefused("format is lm-eval or jsonl", field="format")
    return external.lm_eval_results(found)


def _endpoint(endpoint) -> dict:
    return {"slug": endpoint.slug, "base_url": endpoint.base_url, "model": endpoint.model,
            "credential": endpoint.credential, "problem": endpoint_problem(endpoint)}


@router.get(EVALS + "/endpoints/", response={200: list[EndpointOut], **READ_ERRORS})
def list_endpoints(request, project: str):
    return [_endpoint(e) for e in selectors.endpoint_list(project=caller_project(request, project))]


@router.post(EVALS + "/endpoints/", response={201: EndpointOut, **WRITE_ERRORS})
def add_endpoint(request, project: str, payload: EndpointIn):
    """An OpenAI-compatible server to evaluate (editors), at an address the egress policy allows. Its key is a
    credential from the studio's list, by name: the operator's or one an owner stored for the project."""
    scope = caller_project(request, project, min_role=Role.EDITOR)
    endpoint = endpoint_create(project=scope, slug=payload.slug, base_url=payload.base_url, model=payload.model,
                               credential=payload.credential, api_key_env=payload.api_key_env, actor=request.auth,
                               via="api")
    return Status(201, _endpoint(endpoint))


@router.patch(EVALS + "/endpoints/{endpoint}", response={200: EndpointOut, **WRITE_ERRORS})
def set_endpoint_credential(request, project: str, endpoint: str, payload: EndpointCredentialIn):
    """Point an endpoint at a credential from the list (editors): how an endpoint that named an environment
    variable is fixed."""
    scope = caller_project(request, project, min_role=Role.EDITOR)
    return _endpoint(endpoint_credential_set(project=scope, slug=endpoint, credential=payload.credential,
                                             actor=request.auth, via="api"))


@router.get("/projects/{project}/checkpoints", response={200: list[CheckpointOut], **READ_ERRORS})
def list_checkpoints(request, project: str):
    """Every checkpoint the project's runs saved, newest run first, with its aliases."""
    scope = caller_project(request, project)
    aliases: dict[int, list[str]] = {}
    for alias in CheckpointAlias.objects.filter(project=scope):
        aliases.setdefault(alias.checkpoint_id, []).append(alias.name)
    return [{"run": str(c.run_id), "run_name": c.run.name, "step": c.step, "bytes": c.bytes,
             "aliases": sorted(aliases.get(c.pk, [])), "created_at": c.created_at}
            for c in Checkpoint.objects.filter(run__project=scope).select_related("run")
            .order_by("-run__created_at", "-step")[:1000]]


@router.post("/projects/{project}/checkpoints/aliases", response={200: dict, **WRITE_ERRORS})
def move_checkpoint_alias(request, project: str, payload: AliasIn):
    """Point an alias (champion, challenger, any name) at a checkpoint (editors); the move is audited."""
    scope = caller_project(request, project, min_role=Role.EDITOR)
    try:
        checkpoint = checkpoint_resolve(project=scope, name=payload.checkpoint)
        alias_move(project=scope, name=payload.name, checkpoint=checkpoint, actor=request.auth, via="api")
    except CheckpointNotFound as exc:
        raise exc.about("checkpoint")
    return {"alias": payload.name, "checkpoint": f"{checkpoint.run.name}@{checkpoint.step}"}

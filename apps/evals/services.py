"""Launching evaluations, endpoints, and importing external results. Each write is one transaction with an audit
row."""

from __future__ import annotations

import json

from django.db import IntegrityError, transaction

from apps.accounts.credentials import OPERATOR_PREFIX, CredentialRefused, choices_text, credential_check
from apps.accounts.models import Project
from apps.accounts.services import audit_record
from apps.common import wiring
from apps.common.errors import StudioError
from apps.registry.models import Version
from apps.registry.pins import PinnedBundleError, bundle_tasks
from apps.registry.refs import parse_ref
from apps.registry.selectors import version_resolve
from apps.runs.checkpoints import CheckpointNotFound, checkpoint_keep, checkpoint_resolve, run_find
from apps.runs.models import Checkpoint, Run, RunKind
from apps.runs.services import RunError, run_create
from workers.egress import EgressRefused
from workers.rl.rollout.evaluation import evaluation_steps, suite_tasks
from workers.rl.tasks.overlap import overlap

from .external import HARNESS, ResultsRefused, external_key, read_results
from .models import Endpoint, Evaluation, ExternalEvaluation, TargetKind
from .selectors import training_bundle
from .suites import NotASuite, suite_key, suite_settings

# The settings of the checkpoint's run that make its model what it was (the rest of its config is training's).
MODEL_SETTINGS = ("model", "model_version", "model_sha256", "chat_template", "context_length", "lora_rank",
                  "lora_alpha", "engine", "device")


class EvalError(StudioError, ValueError):
    """An evaluation, endpoint or alias request refused, in words for the person who made it."""


def endpoint_create(*, project: Project, slug: str, base_url: str, model: str, credential: str = "",
                    api_key_env: str = "", actor, via: str = "web") -> Endpoint:
    """An endpoint at an address the egress policy allows, sending the credential it names (one of
    `credential_names`). `api_key_env` is the older way, refused unless it names a declared operator variable
    (STUDIO_ENDPOINT_KEY_<NAME>, taken as operator:<NAME>)."""
    if api_key_env:
        credential = _credential_of_variable(project=project, variable=api_key_env, given=credential)
    _credential_ok(project=project, credential=credential)
    base_url = base_url.strip().rstrip("/")
    admission = endpoint_address_check(base_url)
    with transaction.atomic():
        try:
            endpoint = Endpoint.objects.create(project=project, slug=slug, base_url=base_url, model=model,
                                               credential=credential,
                                               created_by=actor if getattr(actor, "is_authenticated", False)
                                               else None)
        except IntegrityError:
            raise EvalError(f"project {project.slug} already has an endpoint {slug!r}", status=409,
                            field="slug") from None
        audit_record(project=project, actor=actor, action="eval.endpoint.create", target=f"endpoint/{slug}",
                     details={"base_url": endpoint.base_url, "model": model, "credential": credential,
                              "admitted": admission}, via=via)
    endpoint.admission = admission  # which egress rule let its address through, for the page to say
    return endpoint


def endpoint_credential_set(*, project: Project, slug: str, credential: str, actor, via: str = "web") -> Endpoint:
    """Point endpoint `slug` at a credential from the list (how an endpoint made before credentials is fixed)."""
    _credential_ok(project=project, credential=credential)
    with transaction.atomic():
        endpoint = Endpoint.objects.select_for_update().filter(project=project, slug=slug).first()
        if endpoint is None:
            raise EvalError(f"no endpoint {slug!r} in project {project.slug}", status=404, field="endpoint")
        endpoint.credential, endpoint.api_key_env = credential, ""
        endpoint.save(update_fields=["credential", "api_key_env"])
        audit_record(project=project, actor=actor, action="eval.endpoint.credential", target=f"endpoint/{slug}",
                     details={"credential": credential}, via=via)
    return endpoint


def endpoint_address_check(base_url: str, *, field: str = "base_url") -> str:
    """EvalError (about `field`) unless `base_url` is an http(s) URL the egress policy lets the workers reach; else
    which rule admitted it (a public address, or an entry of the operator's STUDIO_EGRESS_ALLOW)."""
    if not base_url.startswith(("http://", "https://")):
        raise EvalError("base_url must be an http(s) URL, e.g. https://api.example.com/v1", field=field)
    try:
        return wiring.egress_policy().check_url(base_url)
    except EgressRefused as exc:
        raise EvalError(f"base_url: {exc}", field=field) from None


def endpoint_problem(endpoint: Endpoint) -> str:
    """Why `endpoint` cannot be evaluated as it is, and what to do; empty when it can."""
    if not endpoint.api_key_env:
        return ""
    return (f"endpoint/{endpoint.slug} reads its API key from the environment variable {endpoint.api_key_env}, "
            f"which endpoints may no longer name (any variable could be one of the studio's own secrets): an editor "
            f"picks its credential on the evals page or with PATCH /api/v1/projects/{endpoint.project.slug}/evals/"
            f"endpoints/{endpoint.slug} {{\"credential\": ...}}; "
            + choices_text(project=endpoint.project))


def _credential_ok(*, project: Project, credential: str, field: str = "credential") -> None:
    try:
        credential_check(project=project, credential=credential, field=field)
    except CredentialRefused as exc:
        raise EvalError(str(exc), field=field) from None


def _credential_of_variable(*, project: Project, variable: str, given: str) -> str:
    if given:
        raise EvalError("name the credential only (api_key_env is the older way)", field="api_key_env")
    if variable.startswith(OPERATOR_PREFIX) and len(variable) > len(OPERATOR_PREFIX):
        return "operator:" + variable[len(OPERATOR_PREFIX):]
    raise EvalError(f"api_key_env: an endpoint may not send the environment variable {variable!r}: its key is a "
                    f"credential from the studio's list; " + choices_text(project=project), field="api_key_env")


def target_resolve(*, project: Project, model: str | None = None, checkpoint: str | None = None,
                   endpoint: str | None = None, trained_by: str | None = None) -> dict:
    """What to evaluate, named as the API and the command take it — `model/SLUG[@N]`, `RUN@STEP` or an alias, an
    endpoint's slug; and the run trained elsewhere that trained it, by name or id — as `evaluation_launch`'s
    keywords. Raises VersionNotFound, CheckpointNotFound, ValueError (a malformed reference) or EvalError (no such
    endpoint or run, or not exactly one thing named)."""
    named = [name for name, value in (("model", model), ("checkpoint", checkpoint), ("endpoint", endpoint)) if value]
    if len(named) != 1:
        raise EvalError("name exactly one of model, checkpoint or endpoint", field="model")
    target = {}
    if trained_by:
        try:
            target["trained_by"] = run_find(project=project, name=trained_by)
        except CheckpointNotFound as exc:
            raise EvalError(str(exc), status=404, field="trained_by") from None
    if model:
        return {**target, "model": version_resolve(project=project, ref=parse_ref(model))}
    if checkpoint:
        return {**target, "checkpoint": checkpoint_resolve(project=project, name=checkpoint)}
    found = Endpoint.objects.filter(project=project, slug=endpoint).first()
    if found is None:
        raise EvalError(f"no endpoint {endpoint!r} in project {project.slug}", status=404, field="endpoint")
    return {**target, "endpoint": found}


def evaluation_launch(*, project: Project, suite: Version, actor, model: Version | None = None,
                      checkpoint: Checkpoint | None = None, endpoint: Endpoint | None = None,
                      trained_by: Run | None = None, via: str = "web") -> Evaluation:
    """Queue an evaluation of one model on `suite`: a base model definition, a run's checkpoint, or an endpoint.
    `trained_by`: the run trained elsewhere (kind external) that trained the model or the endpoint's model, so the
    leaderboard scores apart the suite's tasks its bundle holds, as for a checkpoint of ours."""
    if suite.definition.project_id != project.pk:
        raise EvalError(f"{suite.ref} is not of project {project.slug}", field="suite")
    try:
        settings = suite_settings(suite)
    except NotASuite as exc:
        raise EvalError(str(exc), field="suite") from None
    if sum(x is not None for x in (model, checkpoint, endpoint)) != 1:
        raise EvalError("name one thing to evaluate: a model, a checkpoint or an endpoint", field="model")
    key, parts = suite_key(suite)
    plan = {**settings, "suite": suite.ref, "key": key}
    overrides: dict = {}
    pinned: dict = {"mode": "sync"}  # nothing trains: the engine samples from the model itself, no weight copy
    if model is not None:
        if model.definition.kind != "model" or model.definition.project_id != project.pk:
            raise EvalError(f"{model.ref} is not a model definition of project {project.slug}", field="model")
        overrides["model"] = model.ref
        kind, label = TargetKind.BASE, model.ref
        trains = training_bundle(suite=suite, model=model)
        if trains is not None:
            plan["pretrained_on"] = trains.ref
    elif checkpoint is not None:
        source = checkpoint.run
        if source.project_id != project.pk:
            raise EvalError(f"that checkpoint is not of project {project.slug}", field="checkpoint")
        try:
            checkpoint_keep(checkpoint)  # the run's retention must not remove it before the evaluation reads it
        except CheckpointNotFound as exc:
            raise EvalError(str(exc), field="checkpoint") from None
        pinned.update({name: source.config[name] for name in MODEL_SETTINGS if name in source.config})
        # A run on a dataset alone has no bundle; its weights replace the base model's whole, whichever it is.
        plan.update({"checkpoint": checkpoint.path, "checkpoint_step": checkpoint.step,
                     "pretrained_on": source.bundle.ref if source.bundle is not None else ""})
        kind, label = TargetKind.CHECKPOINT, f"{source.name}@{checkpoint.step}"
    else:
        if endpoint.project_id != project.pk:
            raise EvalError(f"endpoint {endpoint.slug} is not of project {project.slug}", field="endpoint")
        problem = endpoint_problem(endpoint)
        if problem:
            raise EvalError(problem, field="endpoint")
        _credential_ok(project=project, credential=endpoint.credential, field="endpoint")
        endpoint_address_check(endpoint.base_url, field="endpoint")
        plan["endpoint"] = {"base_url": endpoint.base_url, "model": endpoint.model,
                            "credential": endpoint.credential}
        kind, label = TargetKind.ENDPOINT, f"endpoint/{endpoint.slug}"
    pinned["evaluation"] = plan
    try:
        tasks = suite_tasks(bundle_tasks(bundle=suite), per_template=settings["tasks_per_template"],
                            seed=settings["seed"])
    except (PinnedBundleError, ValueError) as exc:
        raise EvalError(f"{suite.ref}: {exc}", field="suite") from None
    if not tasks:
        raise EvalError(f"{suite.ref} has no task instances to evaluate", field="suite")
    found = {}
    if trained_by is not None:
        _trained_by_check(project=project, run=trained_by, checkpoint=checkpoint)
        label = f"{label} · {trained_by.name}"[:200]
    source = checkpoint.run if checkpoint is not None else trained_by
    if source is not None and source.bundle is not None:  # the suite's tasks found among its run's
        found = {"training": source.bundle.ref,
                 **overlap(tasks, bundle_tasks(bundle=source.bundle))}
    with transaction.atomic():
        try:
            run = run_create(project=project, bundle=suite, steps=evaluation_steps(len(tasks)), overrides=overrides,
                             kind=RunKind.EVALUATION, enqueue=True,
                             pinned=pinned, name=f"eval {label} on {suite.ref}"[:200], actor=actor, via=via)
        except RunError as exc:
            raise EvalError(str(exc), field="model") from None
        evaluation = Evaluation.objects.create(
            project=project, suite=suite, key=key, key_parts=parts, run=run, kind=kind, label=label,
            model_version=model, checkpoint=checkpoint, source_run=source,
            checkpoint_step=checkpoint.step if checkpoint else None, endpoint=endpoint, overlap=found,
            created_by=actor if getattr(actor, "is_authenticated", False) else None)
        audit_record(project=project, actor=actor, action="eval.launch", target=f"evaluation/{evaluation.pk}",
                     details={"suite": suite.ref, "what": label, "key": key, "tasks": len(tasks), "run": str(run.pk)},
                     via=via)
    return evaluation


def _trained_by_check(*, project: Project, run: Run, checkpoint: Checkpoint | None) -> None:
    """EvalError unless `run` can be what trained the model evaluated: a run trained elsewhere of `project`, the
    model not a checkpoint (whose own run trained it)."""
    if checkpoint is not None:
        raise EvalError("a checkpoint was trained by its own run: trained_by names the run trained elsewhere of a "
                        "model definition or an endpoint", field="trained_by")
    if run.project_id != project.pk or run.kind != RunKind.EXTERNAL:
        raise EvalError(f"{run.name} is not a run trained elsewhere of project {project.slug}: trained_by names "
                        "one (kind external)", field="trained_by")


def external_import(*, project: Project, document: dict, label: str = "", actor,
                    via: str = "web") -> ExternalEvaluation:
    """An lm-evaluation-harness results file as an external evaluation of the project (its per-sample rows are not
    kept); `label` names the model (default: the file's model_name)."""
    scores, parts = read_results(document)
    config = document.get("config") if isinstance(document.get("config"), dict) else {}
    model_name = str(document.get("model_name") or config.get("model_args") or config.get("model") or "")[:300]
    label = (label or model_name).strip()[:200]
    if not label:
        raise ResultsRefused("name the model: the file names none (model_name), so give it a label", field="label")
    kept = {name: value for name, value in document.items() if name != "samples"}
    if len(json.dumps(kept, default=str)) > 5_000_000:
        raise ResultsRefused("the results file is over 5 MB without its samples")
    key = external_key(parts)
    with transaction.atomic():
        external = ExternalEvaluation.objects.create(
            project=project, label=label, harness=HARNESS, model_name=model_name, key=key, key_parts=parts,
            harness_version=str(document.get("lm_eval_version", ""))[:40], scores=scores,
            results=json.loads(json.dumps(kept, default=str)),
            created_by=actor if getattr(actor, "is_authenticated", False) else None)
        audit_record(project=project, actor=actor, action="eval.external.import",
                     target=f"external-evaluation/{external.pk}",
                     details={"label": label, "harness": HARNESS, "key": key, "tasks": sorted(scores)[:50]}, via=via)
    return external

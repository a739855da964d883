"""Eval pages: the suites and recent evaluations; a suite's leaderboard (models x domains with intervals, tied
groups, what the suite can tell apart, the checkpoints' timeline, and a launch form); a paired comparison of two
evaluations with its per-task diff, each task linked to both trajectories side by side."""

from __future__ import annotations

import json

from django.conf import settings
from django.contrib import messages
from django.http import HttpResponse, StreamingHttpResponse
from django.shortcuts import redirect, render

from apps.accounts.credentials import CredentialRefused, credential_names, project_secret_store
from apps.accounts.models import Role
from apps.accounts.selectors import project_for_page, project_for_user, role_of
from apps.runs.checkpoints import CheckpointNotFound, alias_move, checkpoint_resolve
from apps.runs.domains import PER_PAGE, DomainQuery

from . import breakdown, external, results, selectors, statistics
from .figures import timeline_figure
from .forms import EndpointCredentialForm, EndpointForm, EvaluationLaunchForm, ExternalResultsForm, SecretForm
from .services import (
    EvalError,
    endpoint_create,
    endpoint_credential_set,
    endpoint_problem,
    evaluation_launch,
    external_import,
)
from .suites import key_differences, suite_key


def eval_list(request, project):
    """The suites, recent evaluations and endpoints; editors add endpoints and fix their credentials here, owners
    store the project's API keys (write-only)."""
    project, can_edit = project_for_page(user=request.user, slug=project)
    credentials = credential_names(project=project)
    action = request.POST.get("action") if request.method == "POST" else None
    add = EndpointForm(request.POST if action == "endpoint" else None, credentials=credentials, prefix="endpoint")
    secret = SecretForm(request.POST if action == "secret" else None, prefix="secret")
    imported = ExternalResultsForm(request.POST if action == "external" else None,
                                   request.FILES if action == "external" else None, prefix="external")
    if action:
        project_for_user(user=request.user, slug=project.slug,
                         min_role=Role.OWNER if action == "secret" else Role.EDITOR)
        done = (_external_post(request, project, imported) if action == "external" else
                _eval_list_post(request, project, action, add, secret, credentials))
        if done:
            messages.success(request, done)
            return redirect("evals:list", project=project.slug)
    endpoints = [(e, endpoint_problem(e), EndpointCredentialForm(initial={"slug": e.slug, "credential":
                 e.credential}, credentials=credentials, prefix=f"fix-{e.slug}"))
                 for e in selectors.endpoint_list(project=project)]
    context = {"project": project, "suites": selectors.suite_list(project=project),
               "evaluations": selectors.evaluation_list(project=project)[:50], "endpoints": endpoints,
               "can_edit": can_edit, "is_owner": role_of(user=request.user, project=project) == Role.OWNER,
               "add_form": add, "secret_form": secret, "credentials": credentials,
               "can_store_keys": bool(settings.SECRETS_KEY),
               "external_groups": selectors.external_groups(project=project), "external_form": imported}
    return render(request, "evals/eval_list.html", context,
                  status=400 if add.errors or secret.errors or imported.errors else 200)


def _external_post(request, project, form) -> str:
    """An editor's lm-evaluation-harness results file, imported as an external evaluation (a message), or ""."""
    if not form.is_valid():
        return ""
    try:
        row = external_import(project=project, document=form.cleaned_data["file"],
                                       label=form.cleaned_data["label"], actor=request.user, via="web")
    except external.ResultsRefused as exc:
        form.add_error("file" if exc.field == "results" else "label", str(exc))
        return ""
    return f"Imported {row.label}'s {row.harness} results ({len(row.scores)} tasks) as an external evaluation."


def evaluation_results(request, project, pk, fmt):
    """An evaluation's per-task results to download: the studio's JSONL (a row per answer) or lm-evaluation-harness's
    results JSON (with its samples)."""
    project = project_for_user(user=request.user, slug=project)
    evaluation = selectors.evaluation_get(project=project, pk=pk)
    name = f"evaluation-{evaluation.pk}"
    if fmt == "jsonl":
        response = StreamingHttpResponse(external.result_jsonl(evaluation), content_type="application/x-ndjson")
        response["Content-Disposition"] = f'attachment; filename="{name}.jsonl"'
        return response
    response = HttpResponse(json.dumps(external.lm_eval_results(evaluation), indent=2, ensure_ascii=False),
                            content_type="application/json")
    response["Content-Disposition"] = f'attachment; filename="{name}-lm-eval.json"'
    return response


def _eval_list_post(request, project, action, add, secret, credentials) -> str:
    """What an editor's or owner's form on the evals page did (a message), or "" when its form shows errors."""
    if action == "endpoint" and add.is_valid():
        try:
            endpoint = endpoint_create(project=project, actor=request.user, via="web", **add.cleaned_data)
        except EvalError as exc:
            add.add_error(exc.field if exc.field in add.fields else None, str(exc))
            return ""
        return f"Added endpoint/{endpoint.slug}: {endpoint.admission}."
    if action == "secret" and secret.is_valid():
        try:
            stored = project_secret_store(project=project, actor=request.user, via="web", **secret.cleaned_data)
        except CredentialRefused as exc:
            secret.add_error(exc.field if exc.field in secret.fields else None, str(exc))
            return ""
        return f"Stored project:{stored.name} (it is not shown again)."
    if action == "credential":
        slug = request.POST.get("slug", "")
        fix = EndpointCredentialForm(request.POST, credentials=credentials, prefix=f"fix-{slug}")
        if not fix.is_valid():
            messages.error(request, f"endpoint/{slug}: {'; '.join(e for es in fix.errors.values() for e in es)}")
            return ""
        try:
            endpoint_credential_set(project=project, actor=request.user, via="web", **fix.cleaned_data)
        except EvalError as exc:
            messages.error(request, str(exc))
            return ""
        return f"endpoint/{slug} sends {fix.cleaned_data['credential'] or 'no key'}."
    return ""


def suite_page(request, project, slug, number=None):
    project, can_edit = project_for_page(user=request.user, slug=project)
    suite = selectors.suite_get(project=project, slug=slug, number=number)
    key, parts = suite_key(suite)
    form = EvaluationLaunchForm(request.POST or None, project=project)
    if request.method == "POST":
        project_for_user(user=request.user, slug=project.slug, min_role=Role.EDITOR)
        if form.is_valid():
            try:
                evaluation = evaluation_launch(project=project, suite=suite, actor=request.user,
                                               **form.target(project), via="web")
            except EvalError as exc:
                form.add_error("trained_by" if exc.field == "trained_by" else "what", str(exc))
            else:
                messages.success(request, f"Queued: {evaluation.label} on {suite.ref}.")
                return redirect("evals:suite", project=project.slug, slug=slug, number=suite.number)
    same = [e for e in selectors.evaluation_list(project=project).filter(key=key)]
    others = [(e, key_differences(parts, e.key_parts)) for e in
              selectors.evaluation_list(project=project).filter(suite__definition=suite.definition).exclude(key=key)]
    board = results.leaderboard(same, domains=())  # overall scores; the breakdown scores the domains it shows
    tasks = max((row.scores[results.ALL].tasks for row in board.rows), default=0)
    lines = selectors.timeline(board=board)
    table = [(row, row.scores[results.ALL], board.groups[results.ALL].get(row.evaluation.pk),
              row.clean.get(results.ALL), row.overlapping.get(results.ALL)) for row in board.rows]
    query = DomainQuery.from_params(request.GET, prefix="d", sorts=())
    sort = request.GET.get("dsort", "domain")
    all_columns = request.GET.get("columns") == "all"
    domains = breakdown.leaderboard_breakdown(board, suite, query, all_columns=all_columns, sort=sort)
    context = {"project": project, "suite": suite, "key": key, "parts": parts, "board": board, "others": others,
               "table": table, "breakdown": domains, "domain_query": query, "domain_sort": sort,
               "all_columns": all_columns,
               "domain_per_page": PER_PAGE, "pinned": _pinned(parts, every=request.GET.get("pinned") == "all"),
               "links": {**_page_links(request, domains.page), "columns": _query_with(request, columns="all"),
                         "pinned": _query_with(request, pinned="all")},
               "form": form, "can_edit": can_edit, "tasks": tasks,
               "detectable": statistics.minimum_detectable_difference(tasks) if tasks else None,
               "timeline": timeline_figure(lines) if lines else None,
               "champion": _champion(board)}
    return render(request, "evals/suite.html", context, status=400 if form.errors else 200)


PINNED_SHOWN = 12  # pinned versions the suite page lists before "show all": a suite of a thousand domains pins 3,000


def _pinned(parts: dict, *, every: bool) -> dict:
    """The suite's pinned versions to list, how many there are, and how many of each kind."""
    versions = [pin["version"] for pin in parts["pinned"].values()]
    kinds: dict[str, int] = {}
    for version in versions:
        kind = version.split("/", 1)[0]
        kinds[kind] = kinds.get(kind, 0) + 1
    return {"shown": versions if every else versions[:PINNED_SHOWN], "total": len(versions),
            "kinds": sorted(kinds.items())}


def _query_with(request, **changed) -> str:
    """This page's query string with `changed` parameters replaced."""
    query = request.GET.copy()
    for name, value in changed.items():
        query[name] = str(value)
    return "?" + query.urlencode()


def _page_links(request, page: int) -> dict:
    return {"first": _query_with(request, dpage=1), "previous": _query_with(request, dpage=page - 1),
            "next": _query_with(request, dpage=page + 1)}


def _champion(board) -> dict | None:
    """The regression alert: the newest checkpoint evaluation against the one aliased `champion`, when it is
    significantly worse on some domain."""
    champion = next((r.evaluation for r in board.rows if r.evaluation.checkpoint_id and
                     r.evaluation.checkpoint and r.evaluation.checkpoint.aliases.filter(name="champion").exists()),
                    None)
    newest = max((r.evaluation for r in board.rows if r.evaluation.checkpoint_step is not None
                  and r.evaluation != champion), key=lambda e: e.created_at, default=None)
    if champion is None or newest is None:
        return None
    paired = results.compare(champion, newest, intervals=False)  # significance only: no bootstrap a domain
    worse = [d for d, c in paired.by_domain.items() if d != results.ALL and c.significant and c.difference < 0]
    return {"champion": champion, "newest": newest, "worse": worse}


def checkpoint_list(request, project):
    """The checkpoint registry: every checkpoint the project's runs saved, its training reward at that step, its
    aliases and evaluations; editors move aliases here."""
    project, can_edit = project_for_page(user=request.user, slug=project)
    if request.method == "POST":
        project_for_user(user=request.user, slug=project.slug, min_role=Role.EDITOR)
        try:
            checkpoint = checkpoint_resolve(project=project, name=request.POST.get("checkpoint", ""))
            alias_move(project=project, name=request.POST.get("name", "").strip(), checkpoint=checkpoint,
                       actor=request.user, via="web")
        except CheckpointNotFound as exc:
            messages.error(request, str(exc))
        else:
            messages.success(request, f"{request.POST['name']} -> {checkpoint.run.name}@{checkpoint.step}")
        return redirect("evals:checkpoints", project=project.slug)
    rows = selectors.checkpoint_rows(project=project)
    return render(request, "evals/checkpoints.html", {"project": project, "rows": rows, "can_edit": can_edit})


def compare_page(request, project, a, b):
    """b compared with a: every difference is b − a, and the page names both by what they evaluated."""
    project = project_for_user(user=request.user, slug=project)
    left, right = selectors.evaluation_get(project=project, pk=a), selectors.evaluation_get(project=project, pk=b)
    context = {"project": project, "a": left, "b": right}
    try:
        paired = results.compare(left, right, intervals=False)
        regressions, improvements = results.task_diff(left, right)
    except results.NotComparable as exc:
        context["refused"] = str(exc)
        return render(request, "evals/compare.html", context, status=409)
    query = DomainQuery.from_params(request.GET, prefix="d", sorts=tuple(k for k, _ in breakdown.PAIRED_SORTS))
    significant = request.GET.get("significant") == "1"
    domains = breakdown.paired_breakdown(paired, right.label, query, significant=significant)
    paired.intervals([row.domain for row in domains["rows"]])  # the page's rows' intervals, not a thousand
    domains["rows"] = [breakdown.PairedRow(r.domain, r.category, paired.by_domain[r.domain], r.verdict)
                       for r in domains["rows"]]
    if domains["filtered"]:  # the task lists follow the domain filter
        regressions = [c for c in regressions if c.domain in domains["domain_names"]]
        improvements = [c for c in improvements if c.domain in domains["domain_names"]]
    context.update(paired_domains=domains, domain_query=query, significant=significant,
                   domain_sorts=breakdown.PAIRED_SORTS, domain_per_page=PER_PAGE, changes_shown=CHANGES_SHOWN,
                   changes_slice="" if request.GET.get("changes") == "all" else f":{CHANGES_SHOWN}",
                   all_changes=_query_with(request, changes="all"),
                   regressions=regressions, improvements=improvements,
                   links=_page_links(request, domains["page"]))
    return render(request, "evals/compare.html", context)


CHANGES_SHOWN = 50  # tasks each of the comparison's lists shows (the largest changes) before "show all"

"""Run pages: what is running (where logging in lands), the list, the form that starts a run (launch.py), one
run live, compare runs; the history JSON the pages load.

Each view finds the project for the user first (404 for non-members), then one selector or service.
"""

from __future__ import annotations

import json

from django.conf import settings
from django.contrib import messages
from django.http import JsonResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods, require_POST, require_safe

from apps.accounts.models import Role
from apps.accounts.selectors import project_for_page, project_list_for_user
from apps.common import figures, series
from apps.registry import categories
from apps.registry.diff import spec_diff
from apps.registry.models import Version

from . import domains, launch, selectors
from .models import ACTIVE_STATUSES, DATASET_KINDS, TRAINING_KINDS
from .services import RunError, run_config_resolve, run_create, run_request

COMPARE_LIMIT = 8
COMPARE_CHARTS = 12  # charts the compare page draws at most, however many metrics are asked for
COMPARE_DOMAIN_CHARTS = 5  # runs of this many domains or fewer chart each domain by default


def home(request):
    """Where logging in lands (LOGIN_REDIRECT_URL): what is running in the user's projects — training runs and
    evaluations, each linked to its live page — or, with nothing running, the first project's registry."""
    projects = list(project_list_for_user(user=request.user))
    if not projects:
        return render(request, "registry/no_project.html")
    running = list(selectors.run_list_active(projects=projects))
    if not running:
        return redirect("registry:definition_list", project=projects[0].slug)
    # One project: the page is that project's, with its navigation.
    context = {"running": running, "projects": projects, "project": projects[0] if len(projects) == 1 else None}
    return render(request, "runs/home.html", context)


@require_safe
def run_list(request, project):
    project, can_edit = project_for_page(user=request.user, slug=project)
    runs = list(selectors.run_list(project=project, status=request.GET.get("status") or None, with_reward=True)[:200])
    context = {"project": project, "can_edit": can_edit, "runs": selectors.evaluation_scores(runs)}
    return render(request, "runs/run_list.html", context)


@require_http_methods(["GET", "HEAD", "POST"])
def run_new(request, project):
    """The run form (launch.RunForm), then its review — the resolved config, its hash and the first step's cost,
    nothing queued — then "Queue run". POST action: review (the form's button), queue (the review's button:
    queued only while the config still resolves to the hash the review showed), edit (back to the form).
    GET ?from_run=<id> starts from an earlier run's settings."""
    project, can_edit = project_for_page(user=request.user, slug=project, min_role=Role.EDITOR)
    data = request.POST if request.method == "POST" else None
    source = (data or request.GET).get("from_run", "")
    earlier = next(iter(selectors.runs_get(project=project, run_ids=[source])), None) if source else None
    form = launch.RunForm(data, project=project, earlier=earlier)
    if data is None and request.GET.get("bundle", "").isdigit():  # "Start a run on this bundle" from its page
        form.initial["bundle"] = int(request.GET["bundle"])
    context = {"project": project, "can_edit": can_edit, "form": form, "earlier": earlier,
               "earlier_choices": [r for r in selectors.run_list(project=project)[:100]
                                   if r.kind in TRAINING_KINDS]}
    if source and earlier is None:
        context["missing_run"] = source
    action = request.POST.get("action", "review")
    if data is None or action == "edit":
        return render(request, "runs/run_new.html", context)
    if not form.is_valid():
        return render(request, "runs/run_new.html", context, status=400)
    bundle, overrides = form.cleaned_data["bundle"], form.overrides()
    try:
        config, hashed = run_config_resolve(project=project, bundle=bundle, kind=form.cleaned_data["kind"],
                                            overrides=overrides)
    except RunError as exc:
        form.add_config_error(exc)
        return render(request, "runs/run_new.html", context, status=400)
    if action == "queue" and form.cleaned_data["reviewed"] == hashed:
        try:
            run = run_create(project=project, bundle=bundle, steps=form.cleaned_data["steps"],
                             name=form.cleaned_data["name"], overrides=overrides, actor=request.user, via="web",
                             kind=form.cleaned_data["kind"], enqueue=True)
        except RunError as exc:
            form.add_config_error(exc)
            return render(request, "runs/run_new.html", context, status=400)
        messages.success(request, f"Run {run.name} is queued.")
        return redirect("runs:run_detail", project=project.slug, run_id=run.pk)
    context.update(review=True, config_hash=hashed, overrides=overrides,
                   overrides_json=json.dumps(overrides, indent=2, sort_keys=True),
                   resolved=[(title, [(name, launch.show(config[name]),
                                       launch.origin(name, config[name], overrides=overrides, bundle=bundle))
                                      for name in names])
                             for title, names in launch.grouped(config)],
                   # SFT and DPO sample nothing: their cost is the dataset's rows, not rollouts
                   estimate=(launch.first_step_estimate(bundle=bundle, config=config)
                             if form.cleaned_data["kind"] not in DATASET_KINDS else None),
                   model=config["model"],
                   model_note=launch.default_model_note(config=config, overrides=overrides, bundle=bundle),
                   stale=action == "queue")  # asked to queue what no review showed (or no longer resolves so)
    return render(request, "runs/run_new.html", context, status=409 if action == "queue" else 200)


@require_safe
def run_new_domains(request, project):
    """What the run form's weights and quotas editor lists for ?bundle=<id>: every category of the bundle's domains
    (with how many, a handful to a few dozen), and a page of its domains (?q, category, page, per_page), each with
    its category and own weight: a thousand domains are searched here, not sent to the page."""
    project, _ = project_for_page(user=request.user, slug=project, min_role=Role.EDITOR)
    bundle = Version.objects.filter(pk=_int(request.GET.get("bundle"), None), definition__project=project,
                                    definition__kind="bundle").select_related("definition").first()
    every = categories.bundle_domains(bundle)
    query = domains.DomainQuery.from_params(request.GET, sorts=("domain", "category"))
    matching = [d for d in every if query.matches(d)]
    pages = max(1, -(-len(matching) // query.per_page))
    page = min(query.page, pages)
    shown = domains.sorted_rows(matching, query.sort, query.descending)[(page - 1) * query.per_page:
                                                                       page * query.per_page]
    return JsonResponse({"bundle": bundle.ref if bundle else None, "domains_total": len(every),
                         "categories": [[name or domains.NONE_CATEGORY, n]
                                        for name, n in categories.category_counts(every)],
                         "domains": [{"domain": d.domain, "category": d.category or domains.NONE_CATEGORY,
                                      "weight": d.weight} for d in shown],
                         "total": len(matching), "page": page, "pages": pages})


def run_detail(request, project, run_id):
    """The run live. Its series load from the history endpoint after the page (per-domain ones left out), its
    rewards by domain from the domains endpoint a page at a time: the page itself is the same size at 1,000
    domains as at 10, but for its category filter's options."""
    project, can_edit = project_for_page(user=request.user, slug=project)
    run = selectors.run_get(project=project, run_id=run_id)
    panels = figures.panels_for(selectors.metric_names(run=run, per_domain=False))
    bundle_domains = categories.bundle_domains(run.bundle)
    context = {"project": project, "can_edit": can_edit, "run": run, "live": run.status in ACTIVE_STATUSES,
               "active_statuses": " ".join(ACTIVE_STATUSES),
               "panels": [{"key": p.key, "figure": figures.to_json(figures.panel_figure(p, names, legend=False))}
                          for p, names in panels],
               "panel_rules": figures.panel_rules(),
               "by_domain": bool(bundle_domains) or domains.domain_points(run).exists(),
               "domain_count": len(bundle_domains),
               "domain_categories": [(name or domains.NONE_CATEGORY, n)
                                     for name, n in categories.category_counts(bundle_domains)],
               "domain_heatmap": figures.to_json(figures.domain_heatmap()),
               "domain_per_page": domains.PER_PAGE,
               "per_domain_rule": {"prefixes": [series.REWARD, series.EVAL_REWARD], "overall": list(series.OVERALL)},
               "checkpoints": run.checkpoints.all()[:20], "queue": selectors.run_queue_place(run=run),
               "embedded": settings.EMBEDDED, "external": selectors.external_tally(run=run)}
    return render(request, "runs/run_detail.html", context)


def _int(value, default: int | None = 0) -> int | None:
    try:
        return max(0, int(value))
    except (TypeError, ValueError):
        return default


def run_history(request, project, run_id):
    """Metric points after ?after_step, or from the start (step 0 included) without it, downsampled on the
    server; events after ?after_event; and the status."""
    project, _ = project_for_page(user=request.user, slug=project)
    run = selectors.run_get(project=project, run_id=run_id)
    names = [n for n in request.GET.getlist("name") if n] or None
    history = selectors.metric_history(run=run, after_step=_int(request.GET.get("after_step"), None), names=names,
                                       max_points=min(5000, _int(request.GET.get("max_points"), 1000) or 1000),
                                       per_domain=request.GET.get("per_domain") != "0")
    events = selectors.event_list(run=run, after_id=_int(request.GET.get("after_event")))
    return JsonResponse({**history, "events": [selectors.event_json(e) for e in events],
                         "run": {"id": str(run.pk), "status": run.status, "step": run.step,
                                 "steps_total": run.steps_total, "requested": run.requested}})


@require_safe
def run_domains(request, project, run_id):
    """The run's reward by domain, a page of it (domains.DomainQuery: ?q, category, sort, order, page, per_page,
    buckets): each row's bucket means (the heatmap's row, the sparkline), reward, change and trajectories, and the
    category means over every matching domain."""
    project, _ = project_for_page(user=request.user, slug=project)
    run = selectors.run_get(project=project, run_id=run_id)
    return JsonResponse(domains.domain_table(run, domains.DomainQuery.from_params(request.GET)).to_json())


@require_POST
def run_control(request, project, run_id):
    project, _ = project_for_page(user=request.user, slug=project, min_role=Role.EDITOR)
    run = selectors.run_get(project=project, run_id=run_id)
    action = request.POST.get("action", "")
    try:
        run = run_request(run=run, action=action, actor=request.user, via="web")
    except RunError as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, {"pause": "Pause requested.", "resume": "Resumed: queued for a worker.",
                                   "cancel": "Cancelled." if run.is_external else "Cancel requested.",
                                   "finish": "Finished: its trainer's next episodes are refused."}[action])
    return redirect("runs:run_detail", project=project.slug, run_id=run.pk)


def run_compare(request, project):
    """Runs side by side: a chart per chosen metric (a trace per run), the runs' rewards by domain as a table (a page
    of it: searched, by category, sorted by the difference; domains.domain_comparison) from which a domain's chart
    is added, and each run's bundle and config against the first's. The metric list holds the runs' shared series,
    never a thousand domains: a domain's series is charted from its row."""
    project, can_edit = project_for_page(user=request.user, slug=project)
    runs = selectors.runs_get(project=project, run_ids=request.GET.getlist("run")[:COMPARE_LIMIT])
    context = {"project": project, "can_edit": can_edit, "runs": runs,
               "choices": selectors.run_list(project=project)[:100]}
    if len(runs) >= 1:
        names = sorted({n for run in runs for n in selectors.metric_names(run=run, per_domain=False)},
                       key=lambda n: (n != "reward/mean", not n.startswith("reward/"), n))
        query = domains.DomainQuery.from_params(request.GET, prefix="d", sorts=domains.COMPARE_SORTS)
        comparison = domains.domain_comparison(runs, query)
        measured = {f"{series.REWARD}{row.domain}" for row in comparison.every
                    if any(r is not None for r in row.rewards)}
        asked = [n for n in dict.fromkeys(request.GET.getlist("metric")) if n in names or n in measured]
        # A few domains (the demo's six): their charts as before; hundreds: the overall one, and the table.
        wanted = asked[:COMPARE_CHARTS] or [n for n in ("reward/mean",) if n in names] + (
            sorted(measured) if len(comparison.every) <= COMPARE_DOMAIN_CHARTS else [])
        context.update(metric_names=names + [n for n in wanted if n not in names], metrics=wanted,
                       figures=[{"name": n, "figure": figures.to_json(figures.compare_figure(n, runs))}
                                for n in wanted],
                       comparison=comparison, domain_query=query, domain_sorts=domains.COMPARE_SORTS,
                       domain_per_page=domains.PER_PAGE, domain_columns=2 * len(runs) + 2,
                       domain_rows=[(row, _query_with(request, metric=[*wanted, f"{series.REWARD}{row.domain}"])
                                     + "#charts") for row in comparison.rows],
                       domain_pages={"first": _query_with(request, dpage=1),
                                     "previous": _query_with(request, dpage=comparison.page - 1),
                                     "next": _query_with(request, dpage=comparison.page + 1)})
        base = runs[0]
        every = request.GET.get("changes") == "all"
        context["diffs"] = [{"run": other,
                             "bundle": _bounded(spec_diff(_bundle_lock(base), _bundle_lock(other)), every),
                             "config": _bounded(spec_diff(base.config, other.config), every)} for other in runs[1:]]
        context["all_changes"] = _query_with(request, changes="all")
    return render(request, "runs/run_compare.html", context)


DIFF_SHOWN = 40  # changes a diff lists before "show all": two bundles of a thousand domains differ a thousand times


def _bounded(changes: list, every: bool) -> dict:
    """A diff's changes to list (the first DIFF_SHOWN unless `every`), how many there are, and how many of each
    kind."""
    counts: dict[str, int] = {}
    for change in changes:
        counts[change.op] = counts.get(change.op, 0) + 1
    return {"shown": changes if every else changes[:DIFF_SHOWN], "total": len(changes),
            "counts": sorted(counts.items())}


def _query_with(request, **changed) -> str:
    """This page's query string with `changed` parameters replaced (a list value repeats its name)."""
    query = request.GET.copy()
    for name, value in changed.items():
        query.setlist(name, [str(v) for v in value] if isinstance(value, list) else [str(value)])
    return "?" + query.urlencode()


def _bundle_lock(run) -> dict:
    """What a run pinned: its bundle version and the version it resolved for every member (nothing for a run on a
    dataset alone, whose dataset and its hash are in the config)."""
    if run.bundle is None:
        return {}
    pinned = {p.name: f"@{p.ref.number} {p.content_hash[:12]}" for p in run.bundle.lock.pinned}
    return {"bundle": run.bundle.ref, "pinned": pinned}

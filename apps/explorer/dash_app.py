"""The Dash explorer of one project: slice its trajectories by run, category, domain, template, verifier layer,
status and policy version; reward distributions, cost and latency histograms, and the trainer's idle time over steps.

At hundreds of domains: the domain dropdown offers the DOMAIN_OPTIONS first domains that match what is typed (and the
category chosen), never all of them; the distributions by domain become distributions by category (the domains'
newest versions', apps/registry/categories.py) once a slice holds more than MAX_GROUPS domains.

One Dash app per project, built on first use, mounted at /p/<slug>/explore/ (views.py checks membership
before a request reaches it). Its figures come from apps.common.figures, as the run pages' do.

Why plain Dash and not django-plotly-dash: that package re-implements Dash's callback dispatch through private
APIs (it breaks on Dash 4.4) and its websocket consumer lets any client subscribe to any channel. Dash's own
Flask server, called from one Django view, keeps every endpoint behind our login with no private API.
"""

from __future__ import annotations

import statistics
import threading
from collections import defaultdict

from dash import Dash, Input, Output, dcc, html
from flask import Flask

from apps.common import figures
from apps.registry.categories import NO_CATEGORY, project_categories, project_domain_categories
from apps.runs.models import Run
from apps.runs.selectors import metric_history, metric_names
from apps.trajectories.models import Trajectory
from apps.trajectories.selectors import BadFilter, trajectory_slice

DOMAIN_OPTIONS = 50  # domains the dropdown lists for what is typed (the chosen ones besides)
MAX_GROUPS = 8  # distributions a histogram overlays before it groups domains by category

# A project's app, with the slug and name it was built from: its routes carry the slug and its title the name, so a
# project renamed (or another project given a recycled id, as a test database's are) gets its app rebuilt instead of
# one that answers 404 at every path of the new slug; the old one is let go.
_apps: dict[int, tuple[tuple[str, str], Dash]] = {}
_lock = threading.Lock()

# The studio's navigation is the viewer's (their projects, their name, a logout form with their CSRF token), while
# this page is the app's, shared by everyone: views.py puts the navigation in place of NAVIGATION per request.
NAVIGATION = "<!-- the studio's navigation -->"
INDEX = """<!DOCTYPE html>
<html><head>{%metas%}<title>{%title%}</title>{%favicon%}{%css%}
<link rel="stylesheet" href="/static/css/studio.css"><link rel="stylesheet" href="/static/css/live.css"></head>
<body>""" + NAVIGATION + """
<main class="explorer">{%app_entry%}</main>
<footer>{%config%}{%scripts%}{%renderer%}</footer></body></html>"""


def explorer_app(project) -> Dash:
    built_from = (project.slug, project.name)
    with _lock:
        cached = _apps.get(project.pk)
        if cached is None or cached[0] != built_from:
            cached = _apps[project.pk] = (built_from, _build(project))
        return cached[1]


def _build(project) -> Dash:
    prefix = f"/p/{project.slug}/explore/"
    app = Dash(f"explorer-{project.slug}", server=Flask(f"explorer-{project.slug}"), requests_pathname_prefix=prefix,
               routes_pathname_prefix=prefix, serve_locally=True, title=f"Explorer · {project.name}",
               index_string=INDEX, csrf_token_name="csrftoken", csrf_header_name="X-CSRFToken",
               suppress_callback_exceptions=True, update_title=None,
               use_async=False)  # callbacks run in the request's own thread (and database connection)
    app.layout = lambda: _layout(project)
    _callbacks(app, project)
    return app


def _options(values) -> list[dict]:
    return [{"label": v or "(none)", "value": v} for v in sorted(set(values))]


def _layout(project):
    runs = list(Run.objects.filter(project=project).order_by("-created_at").values("id", "name")[:200])
    recent = trajectory_slice(project=project, limit=5000)
    dropdown = dict(multi=True, placeholder="any", style={"minWidth": "11rem"})
    return html.Div([
        dcc.Location(id="url"),
        html.H1(f"Explorer · {project.name}"),
        html.P("Slices of the newest 20,000 trajectories that match; every figure follows the filters.",
               className="muted"),
        html.Div(className="explorer-filters", children=[
            html.Label(["Run", dcc.Dropdown(id="run", options=[{"label": r["name"], "value": str(r["id"])}
                                                               for r in runs], placeholder="all runs",
                                            style={"minWidth": "14rem"})]),
            html.Label(["Category", dcc.Dropdown(id="category", options=_options(project_categories(project)),
                                                 **dropdown)]),
            html.Label(["Domain", dcc.Dropdown(id="domain", options=_domain_options(project, "", None, None),
                                               multi=True, placeholder="type to search",
                                               style={"minWidth": "11rem"})]),
            html.Label(["Template", dcc.Dropdown(id="template", options=_options(r["template"] for r in recent),
                                                 **dropdown)]),
            html.Label(["Verifier layer", dcc.Dropdown(id="layer", options=_options(r["deciding_layer"]
                                                                                    for r in recent), **dropdown)]),
            html.Label(["Status", dcc.Dropdown(id="status", options=_options(
                ["ok", "policy_error", "timeout", "infra_error"]), **dropdown)]),
            html.Label(["Policy versions", html.Div([dcc.Input(id="policy-min", type="number", min=0,
                                                               placeholder="from", style={"width": "5rem"}),
                                                     dcc.Input(id="policy-max", type="number", min=0,
                                                               placeholder="to", style={"width": "5rem"})])]),
        ]),
        html.P(id="summary", className="summary"),
        html.Div(className="explorer-grid", children=[
            dcc.Graph(id="reward-hist"), dcc.Graph(id="reward-by-version"),
            dcc.Graph(id="cost-hist"), dcc.Graph(id="latency-hist"), dcc.Graph(id="idle-time"),
        ]),
    ])


def _known_domains(project) -> dict[str, str]:
    """The domains the explorer offers, with their categories: the project's registry's, and any its newest
    trajectories name (a run's trainer may name one the registry does not hold)."""
    known = project_domain_categories(project)
    recent = (Trajectory.objects.filter(project=project).order_by("-finished_at", "id")
              .values_list("domain", flat=True)[:5000])
    for domain in set(recent):
        known.setdefault(domain, NO_CATEGORY)
    return known


def _domain_options(project, search, categories, chosen) -> list[dict]:
    """The first DOMAIN_OPTIONS domains whose name holds `search`, of `categories` if any are chosen, and the
    domains already chosen."""
    search = (search or "").strip().lower() if isinstance(search, str) else ""
    categories = set(categories) if isinstance(categories, list) else set()
    chosen = [c for c in chosen if isinstance(c, str)] if isinstance(chosen, list) else []
    matches = [d for d, c in sorted(_known_domains(project).items())
               if search in d.lower() and (not categories or c in categories)][:DOMAIN_OPTIONS]
    return _options([*matches, *chosen])


def _callbacks(app: Dash, project) -> None:
    @app.callback(Output("run", "value"), Input("url", "search"))
    def run_from_url(search):
        from urllib.parse import parse_qs

        values = parse_qs((search or "").lstrip("?")).get("run")
        return values[0] if values else None

    @app.callback(Output("domain", "options"), Input("domain", "search_value"), Input("category", "value"),
                  Input("domain", "value"))
    def domain_options(search, categories, chosen):
        return _domain_options(project, search, categories, chosen)

    @app.callback(
        Output("summary", "children"), Output("reward-hist", "figure"), Output("reward-by-version", "figure"),
        Output("cost-hist", "figure"), Output("latency-hist", "figure"), Output("idle-time", "figure"),
        Input("run", "value"), Input("domain", "value"), Input("template", "value"), Input("layer", "value"),
        Input("status", "value"), Input("policy-min", "value"), Input("policy-max", "value"),
        Input("category", "value"))
    def update(run, domains, templates, layers, statuses, policy_min, policy_max, categories):
        try:
            rows = trajectory_slice(project=project, run=run or None, domains=domains or (),
                                    categories=categories or (), templates=templates or (), layers=layers or (),
                                    statuses=statuses or (), policy_min=policy_min, policy_max=policy_max)
        except BadFilter as exc:  # a hand-made callback (the page's own controls cannot send these)
            return (f"No trajectories: {exc}.", *explorer_figures(project=project, rows=[], run_id=None))
        return (_summary(rows), *explorer_figures(project=project, rows=rows, run_id=run or None))


def _summary(rows) -> str:
    rewards = [r["reward"] for r in rows if r["reward"] is not None]
    if not rows:
        return "No trajectories match."
    mean = f"{statistics.fmean(rewards):.3f}" if rewards else "—"
    return (f"{len(rows):,} trajectories · mean reward {mean} · "
            f"{sum(r['status'] != 'ok' for r in rows):,} not ok · cost {sum(r['cost'] for r in rows):.4f}")


def explorer_figures(*, project, rows: list[dict], run_id=None) -> list:
    """The explorer's five figures for a slice of trajectories (and one run's idle time)."""
    by_domain, by_status, costs = defaultdict(list), defaultdict(list), defaultdict(list)
    by_version = defaultdict(list)
    for r in rows:
        if r["reward"] is not None:
            by_domain[r["domain"]].append(r["reward"])
            by_version[r["policy_version"]].append(r["reward"])
        by_status[r["status"]].append(r["duration_s"])
        costs[r["domain"]].append(r["cost"])
    versions = sorted(by_version)
    mean_by_version = {"reward/mean": {"step": versions, "wall_time": versions,
                                       "value": [statistics.fmean(by_version[v]) for v in versions]}}
    version_panel = figures.Panel("by-version", "Mean reward by policy version", y_title="reward")
    version_figure = figures.panel_figure(version_panel, ["reward/mean"], mean_by_version)
    version_figure.update_xaxes(title="policy version")
    run = Run.objects.filter(project=project, pk=run_id).first() if run_id else \
        Run.objects.filter(project=project).order_by("-created_at").first()
    idle_panel = next(p for p in figures.RUN_PANELS if p.key == "idle")
    if run is not None:
        names = [n for n in metric_names(run=run) if idle_panel.matches(n)]
        idle = figures.panel_figure(idle_panel, names, metric_history(run=run, names=names, max_points=500)["series"])
        idle.update_layout(title=dict(text=f"{idle_panel.title}: {run.name}"))
    else:
        idle = figures.panel_figure(idle_panel, [])
    categories = project_domain_categories(project) if len(by_domain) > MAX_GROUPS or len(costs) > MAX_GROUPS \
        else {}
    reward_title, reward_groups = _grouped("Reward", by_domain, categories)
    cost_title, cost_groups = _grouped("Cost per trajectory", costs, categories)
    return [figures.histogram_figure(reward_title, reward_groups, "reward"), version_figure,
            figures.histogram_figure(cost_title, cost_groups, "money"),
            figures.histogram_figure("Latency by status", dict(by_status), "seconds"), idle]


def _grouped(title: str, by_domain: dict[str, list[float]], categories: dict[str, str]) -> tuple[str, dict]:
    """A histogram's groups: by domain up to MAX_GROUPS domains; beyond, by category (each domain's newest
    version's), the largest MAX_GROUPS with the rest as "other"; never a distribution per domain of hundreds."""
    if len(by_domain) <= MAX_GROUPS:
        return f"{title} by domain", dict(by_domain)
    grouped: dict[str, list[float]] = defaultdict(list)
    for domain, values in by_domain.items():
        grouped[categories.get(domain) or "(no category)"].extend(values)
    largest = sorted(grouped, key=lambda name: -len(grouped[name]))
    shown = {name: grouped[name] for name in sorted(largest[:MAX_GROUPS])}
    rest = [v for name in largest[MAX_GROUPS:] for v in grouped[name]]
    if rest:
        shown["other"] = rest
    return f"{title} by category ({len(by_domain)} domains)", shown

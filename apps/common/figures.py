"""Plotly figures, defined once here and shared by the run page, the compare page and the Dash explorer.

A run page's panels are chosen by metric name. The pages render a panel's figure here with empty traces and the
browser fills in x and y (history first, then live points); the explorer fills the same figures with data on the
server. The per-domain series (reward/<domain>, eval/reward/<domain>: apps/common/series.py) are in no panel: a run
has hundreds of them, shown as a heatmap and a table (`domain_heatmap`, apps/runs/domains.py), never as traces.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import plotly.graph_objects as go
import plotly.io as pio

from .series import is_per_domain

COLOURS = ["#2f5bd3", "#d9672b", "#2e9b46", "#a23fb5", "#c99a16", "#1a9bb0", "#c03434", "#6b7486", "#7a5c2e"]
# No plotly template: its JSON would ride along with every figure; these few settings are the look.
# Fixed margins, not automargin: automargin lays a chart out twice, and a run page redraws charts live.
AXIS = dict(gridcolor="#eef1f5", zerolinecolor="#d9dee6", linecolor="#d9dee6")
LAYOUT = dict(template="none", paper_bgcolor="#ffffff", plot_bgcolor="#ffffff", colorway=COLOURS,
              height=260, margin=dict(l=50, r=20, t=36, b=36),
              font=dict(family="system-ui, sans-serif", size=12), legend=dict(orientation="h", y=-0.2),
              hovermode="x unified", uirevision="keep")


@dataclass(frozen=True)
class Panel:
    key: str
    title: str
    prefixes: tuple[str, ...] = ()  # names starting with one of these ...
    names: tuple[str, ...] = ()  # ... or exactly one of these
    exclude: tuple[str, ...] = ()
    y_title: str = ""
    stacked: bool = False  # stacked areas (idle time by cause)
    secondary: tuple[str, ...] = ()  # series on a right-hand axis (entropy beside KL)
    y_format: str = ""  # d3 format of the y ticks

    def matches(self, name: str) -> bool:
        if name in self.exclude:
            return False
        return name in self.names or any(name.startswith(p) for p in self.prefixes)


# First match wins; a name no panel takes gets a panel of its namespace ("trainer", "infra", ...).
RUN_PANELS = (
    Panel("reward", "Reward (mean over the step's tasks; by domain below)", names=("reward/mean",),
          y_title="reward"),
    Panel("throughput", "Trajectories per hour: effective vs all",
          names=("throughput/trajectories_per_hour", "throughput/effective_trajectories_per_hour"), y_title="per hour"),
    # Prices are per hour in the settings' one currency (GPU_PRICE_PER_HOUR ...); a task costs fractions of a cent.
    Panel("cost", "Cost per task", names=("cost/per_task",), y_format=".2~r"),
    Panel("idle", "Trainer idle time by cause", prefixes=("idle/",), y_title="seconds per step", stacked=True),
    Panel("staleness", "Staleness (policy versions behind)", prefixes=("staleness/",), y_title="versions"),
    # Partial rollouts (workers/rl/rollout/collectors.py): a trajectory's tokens come from several policy versions;
    # the step's trained tokens by how many versions behind the trained weights sampled them, stacked, and those
    # too stale to train on (left out of the loss).
    Panel("tokens_by_staleness", "Trained tokens by policy versions behind (too stale: left out of the loss)",
          prefixes=("tokens_by_staleness/",), y_title="tokens per step", stacked=True),
    Panel("policy", "KL and entropy", names=("policy/kl", "policy/entropy"), y_title="KL",
          secondary=("policy/entropy",)),
    Panel("slope", "Reward slope per hour", names=("reward/slope_per_hour",), y_title="reward per hour"),
    Panel("turns", "Turns and tool calls per trajectory", prefixes=("turns/",), y_title="per trajectory"),
    Panel("limits", "Share of trajectories that hit each limit", prefixes=("limits/",), y_title="share",
          y_format=".0%"),
    # Repair tasks (rollout/feedback.py): of the solved trajectories, those where a test run failed, an edit
    # followed and a later run passed; the step's and the run's evaluations' side by side.
    Panel("repair", "Fixed after feedback (share of solved repair trajectories)",
          names=("repair/fixed_after_feedback", "eval/repair/fixed_after_feedback"), y_title="share",
          y_format=".0%"),
    # SFT and DPO runs (workers/rl/training/supervised_pipeline.py): their loss, the DPO pairs' implicit rewards
    # and how often the chosen answer wins, and the optimizer's learning rate and gradient norm, each on its scale.
    Panel("loss", "Training loss", prefixes=("loss/",), y_title="loss"),
    Panel("preference_accuracy", "DPO: pairs whose chosen answer is preferred", names=("preference/accuracy",),
          y_title="fraction of pairs"),
    Panel("preference", "DPO: implicit rewards (β × log-ratio to the reference) and their margin",
          prefixes=("preference/",), y_title="reward"),
    Panel("learning_rate", "Learning rate", names=("optimizer/learning_rate",), y_format=".2~e"),
    Panel("grad_norm", "Gradient norm (before clipping)", names=("optimizer/grad_norm",)),
)


def panel_for(name: str) -> Panel:
    for panel in RUN_PANELS:
        if panel.matches(name):
            return panel
    namespace = name.split("/", 1)[0]
    return Panel(f"ns-{namespace}", namespace.replace("_", " ").capitalize(), prefixes=(f"{namespace}/",))


def panels_for(names) -> list[tuple[Panel, list[str]]]:
    """The panels these metric names fill, in page order, each with its series; the per-domain series fill none."""
    chosen: dict[str, tuple[Panel, list[str]]] = {}
    for name in sorted(n for n in names if not is_per_domain(n)):
        panel = panel_for(name)
        chosen.setdefault(panel.key, (panel, []))[1].append(name)
    order = [p.key for p in RUN_PANELS]
    return sorted(chosen.values(), key=lambda item: (order.index(item[0].key) if item[0].key in order else 99,
                                                     item[0].key))


def _label(name: str) -> str:
    return name.split("/", 1)[1].replace("_", " ") if "/" in name else name


def trace_for(panel: Panel, name: str, index: int, x=(), y=()) -> go.Scatter:
    colour = COLOURS[index % len(COLOURS)]
    line = dict(color=colour, width=2.5 if name == "reward/mean" else 1.6)
    return go.Scatter(x=list(x), y=list(y), name=_label(name), meta=name, mode="lines", line=line,
                      stackgroup="idle" if panel.stacked else None,
                      yaxis="y2" if name in panel.secondary else "y")


def panel_figure(panel: Panel, names: list[str], series: dict | None = None, x_key: str = "step",
                 legend: bool = True) -> go.Figure:
    """One panel; with `series` ({name: {"step", "wall_time", "value"}}) it carries the data too. The live run
    page draws its legends in HTML (`legend=False`): a Plotly legend is a third of a redraw's cost."""
    series = series or {}
    traces = [trace_for(panel, name, i, series.get(name, {}).get(x_key, ()), series.get(name, {}).get("value", ()))
              for i, name in enumerate(names)]
    figure = go.Figure(traces)
    figure.update_layout(**LAYOUT, title=dict(text=panel.title, x=0.01, font=dict(size=14)),
                         xaxis=dict(AXIS),  # step or wall time, as the page's x-axis control says
                         yaxis=dict(AXIS, title=panel.y_title, rangemode="tozero" if panel.stacked else "normal",
                                    tickformat=panel.y_format or None))
    if panel.secondary:
        figure.update_layout(yaxis2=dict(title=_label(panel.secondary[0]), overlaying="y", side="right",
                                         showgrid=False), margin=dict(l=50, r=50, t=36, b=36))
    if not legend:
        figure.update_layout(showlegend=False, margin=dict(l=60, r=50 if panel.secondary else 20, t=36, b=24))
    return figure


def compare_figure(name: str, runs: list) -> go.Figure:
    """One metric, one trace per run (`meta` is the run id); the browser fills the data."""
    figure = go.Figure([go.Scatter(x=[], y=[], name=run.name, meta=str(run.pk), mode="lines",
                                   line=dict(color=COLOURS[i % len(COLOURS)], width=1.8))
                        for i, run in enumerate(runs)])
    figure.update_layout(**LAYOUT, title=dict(text=name, x=0.01, font=dict(size=14)), xaxis=AXIS,
                         yaxis=AXIS)
    return figure


def histogram_figure(title: str, groups: dict[str, list[float]], x_title: str, bins: int = 30) -> go.Figure:
    """Distributions overlaid by group (reward by domain, latency by status ...)."""
    figure = go.Figure([go.Histogram(x=values, name=group, nbinsx=bins, opacity=0.65,
                                     marker=dict(color=COLOURS[i % len(COLOURS)]))
                        for i, (group, values) in enumerate(groups.items())])
    figure.update_layout(**{**LAYOUT, "hovermode": "closest", "legend": dict(orientation="h", y=-0.32),
                            "margin": dict(l=50, r=20, t=36, b=56)}, barmode="overlay",
                         title=dict(text=title, x=0.01, font=dict(size=14)), xaxis=dict(AXIS, title=x_title),
                         yaxis=dict(AXIS, title="trajectories"))
    return figure


def timeline_figure(rows: list[dict]) -> go.Figure:
    """A trajectory's timings as bars on one time axis: rows of {label, start, duration, kind}."""
    kinds = {"generation": COLOURS[0], "tool": COLOURS[1], "verification": COLOURS[2], "phase": COLOURS[7]}
    figure = go.Figure([go.Bar(y=[r["label"] for r in rows], x=[r["duration"] for r in rows],
                               base=[r["start"] for r in rows], orientation="h",
                               marker=dict(color=[kinds.get(r["kind"], COLOURS[3]) for r in rows]),
                               hovertemplate="%{y}: %{base:.2f}s + %{x:.2f}s<extra></extra>")])
    figure.update_layout(**{**LAYOUT, "hovermode": "closest", "height": 70 + 26 * len(rows),
                            "margin": dict(l=110, r=20, t=10, b=40)}, showlegend=False,
                         xaxis=dict(AXIS, title="seconds since the trajectory started"),
                         yaxis=dict(AXIS, autorange="reversed"))
    return figure


def to_json(figure: go.Figure) -> str:
    return pio.to_json(figure, validate=False)


# Reward 0 is red, 1 green, through a pale middle: a domain never solved, always solved, or learning reads at a glance.
REWARD_COLOURS = [[0.0, "#c03434"], [0.5, "#f3efe0"], [1.0, "#2e9b46"]]


def domain_heatmap() -> go.Figure:
    """Reward by domain (rows) and step (columns), the run page's and the compare page's: empty here, the browser
    fills z (a row per domain of the page, or per category, a column per bucket of steps), x and y from the domains
    endpoint. One trace however many domains: a page of rows, never a chart per domain."""
    figure = go.Figure([go.Heatmap(z=[], x=[], y=[], zmin=0, zmax=1, colorscale=REWARD_COLOURS, hoverongaps=False,
                                   colorbar=dict(title=dict(text="reward"), thickness=12),
                                   hovertemplate="%{y}<br>steps to %{x}: %{z:.3f}<extra></extra>")])
    figure.update_layout(**{**LAYOUT, "hovermode": "closest", "margin": dict(l=150, r=20, t=36, b=36)},
                         title=dict(text="Reward by domain and step", x=0.01, font=dict(size=14)),
                         xaxis=dict(AXIS, title="step"), yaxis=dict(AXIS, autorange="reversed", type="category"))
    return figure


def panel_rules() -> list[dict]:
    """The panels' matching rules for the browser, which places a series that appears live (a limit first hit)."""
    return [{k: v for k, v in asdict(p).items() if k in ("key", "prefixes", "names", "exclude", "stacked",
                                                          "secondary")} for p in RUN_PANELS]


__all__ = ["REWARD_COLOURS", "RUN_PANELS", "Panel", "compare_figure", "domain_heatmap", "histogram_figure",
           "panel_figure", "panel_for", "panel_rules", "panels_for", "timeline_figure", "to_json", "trace_for"]

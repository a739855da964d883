"""The timeline figure: a run's checkpoints on a suite, score by training step with its interval as a band."""

from __future__ import annotations

import plotly.graph_objects as go

from apps.common.figures import COLOURS, LAYOUT


def timeline_figure(lines: dict) -> dict:
    figure = go.Figure(layout={**LAYOUT, "title": "Checkpoints on this suite", "xaxis_title": "training step",
                               "yaxis_title": "score", "hovermode": "closest"})
    for index, (name, points) in enumerate(sorted(lines.items())):
        colour = COLOURS[index % len(COLOURS)]
        steps = [step for step, _ in points]
        lows = [s.low if s.low is not None else s.mean for _, s in points]
        highs = [s.high if s.high is not None else s.mean for _, s in points]
        figure.add_trace(go.Scatter(x=steps + steps[::-1], y=highs + lows[::-1], fill="toself", opacity=0.2,
                                    line={"width": 0, "color": colour}, hoverinfo="skip", showlegend=False))
        figure.add_trace(go.Scatter(x=steps, y=[s.mean for _, s in points], mode="lines+markers", name=name,
                                    line={"color": colour}))
    return figure.to_plotly_json()

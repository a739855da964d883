"""The engine's own metrics and log context, for Prometheus and the JSON logs (prometheus-client, no Django).

Metrics are recorded in whichever process does the work — the web process of the embedded studio, a `verify` or
`rollout` Celery worker, the GPU worker — and each exposes its own: the web process at /metrics, a Celery worker
on STUDIO_METRICS_PORT (studio/celery.py). What the database knows (runs, their trainer and throughput figures)
is read at scrape time by the web process instead (apps/operations/metrics.py), so it is exposed once.

The log context carries the run, attempt and trajectory a log line was written for (contextvars: a thread or task
sets it for what it does), and the JSON log formatter adds it to every line (studio/settings.py LOGGING).
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
from typing import TYPE_CHECKING

from prometheus_client import Counter, Histogram

if TYPE_CHECKING:
    from workers.definitions.specs import VerifierSpec

VERIFIER_LAYER_SECONDS = Histogram(
    "studio_verifier_layer_seconds", "Time a verifier layer took on one response (its checks, retries included)",
    ["layer_kind"], buckets=(0.001, 0.005, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120))
VERDICTS = Counter("studio_verdicts_total", "Verdicts given, by the layer that decided and the status",
                   ["deciding_layer_kind", "status"])
JUDGE_CALLS = Counter("studio_judge_calls_total", "Checks graded by an LLM judge (score_model, label_model)",
                      ["check_type", "status"])
JUDGE_COST = Counter("studio_judge_cost_total", "Money spent on judge calls, in the configured price's currency")
# Speculative decoding from the context (workers/rl/engines/speculation.py), in the process whose engine samples:
# accepted / drafted is its acceptance rate.
SPECULATIVE_TOKENS = Counter("studio_speculative_tokens_total",
                             "Tokens drafted from the context and verified by the engine, and those accepted",
                             ["outcome"])

JUDGE_CHECKS = ("score_model", "label_model")

# Immutable default (an empty tuple of pairs): each log_context sets a new value, never changes one in place.
_context: contextvars.ContextVar[tuple[tuple[str, str], ...]] = contextvars.ContextVar("studio_log_context",
                                                                                      default=())


def verdict_observed(spec: VerifierSpec, verdict) -> None:
    """Record one verdict: each layer's time, the deciding layer and status, the judge calls and their cost."""
    kinds = {layer.name: layer.kind for layer in spec.layers}
    seconds: dict[str, float] = {}
    for component in verdict.components:
        seconds[component.layer] = seconds.get(component.layer, 0.0) + component.latency_ms / 1000
        if component.type in JUDGE_CHECKS:
            JUDGE_CALLS.labels(component.type, component.status).inc()
    for layer, spent in seconds.items():
        VERIFIER_LAYER_SECONDS.labels(kinds.get(layer, "unknown")).observe(spent)
    deciding = verdict.layers_run[-1] if verdict.layers_run else ""
    VERDICTS.labels(kinds.get(deciding, "none"), verdict.status).inc()
    if verdict.cost:
        JUDGE_COST.inc(verdict.cost)


@contextlib.contextmanager
def log_context(**ids):
    """Within the block, log lines carry these ids (run, attempt, trajectory) besides the ones already set."""
    merged = {**dict(_context.get()), **{key: str(value) for key, value in ids.items() if value is not None}}
    token = _context.set(tuple(merged.items()))
    try:
        yield
    finally:
        _context.reset(token)


class LogContextFilter(logging.Filter):
    """Adds the current log context's ids to each record (as attributes the JSON formatter writes out)."""

    def filter(self, record: logging.LogRecord) -> bool:
        for key, value in _context.get():
            setattr(record, key, value)
        return True

"""Which metric series are per domain: `reward/<domain>` (each step's mean reward of the domain's trajectories)
and `eval/reward/<domain>` (the start-of-run and later evaluations). A run of a thousand domains has a thousand of
each, so no page draws them as traces or streams them: the run page reads them as a heatmap and a table from its
domains endpoint (apps/runs/domains.py), the live updates leave them out (apps/runs/live.py).

No Django, no plotly: the live updates import this in every worker process.
"""

from __future__ import annotations

REWARD = "reward/"
EVAL_REWARD = "eval/reward/"
# Series under those prefixes that are not a domain's: the step's overall mean and the slope of it.
OVERALL = ("reward/mean", "reward/slope_per_hour", "eval/reward/mean")


def domain_of(name: str) -> str | None:
    """The domain a per-domain reward series (`reward/<domain>`) is of; None for any other series."""
    if name.startswith(REWARD) and name not in OVERALL:
        return name[len(REWARD):]
    return None


def eval_domain_of(name: str) -> str | None:
    """The domain an evaluation series (`eval/reward/<domain>`) is of; None for any other series."""
    if name.startswith(EVAL_REWARD) and name not in OVERALL:
        return name[len(EVAL_REWARD):]
    return None


def is_per_domain(name: str) -> bool:
    return domain_of(name) is not None or eval_domain_of(name) is not None


__all__ = ["EVAL_REWARD", "OVERALL", "REWARD", "domain_of", "eval_domain_of", "is_per_domain"]

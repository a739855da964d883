"""Hypothesis strategies and settings the property-based tests share: JSON of every shape a client can send
(NaN and infinities, integers past 64 bits and past what a float holds, lone surrogates, deep nesting), and a
bounded, reproducible budget of examples."""

import base64
import json
from datetime import UTC, timedelta, timezone

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st


def bounded(examples: int) -> settings:
    """Reproducible (derandomized, no example database written to the repository) and bounded; the database
    fixtures a test reads are the same for every example, so reusing them across examples is intended."""
    return settings(max_examples=examples, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                           HealthCheck.data_too_large])


# Numbers at the edges: past 64 bits, past what a float holds, NaN and infinities (json writes and reads them).
EDGE_NUMBERS = st.sampled_from([0, -1, 2**63, -(2**63) - 1, 10**30, 10**400, -(10**400), 1e308, float("nan"),
                                float("inf"), float("-inf"), -0.0, 5e-324, True, False])
# Times as cursors hold them; offsets that take one out of datetime's years once in UTC included.
TIMES = st.datetimes(timezones=st.sampled_from([UTC, timezone(timedelta(hours=14)),
                                                timezone(timedelta(hours=-12))])).map(
    lambda moment: {"t": moment.isoformat()})
# Text with lone surrogates included (the default alphabet leaves them out).
ANY_TEXT = st.text(st.characters(codec=None, exclude_categories=()), max_size=20)


def json_values(*leaves: st.SearchStrategy) -> st.SearchStrategy:
    """Any JSON value (lists and objects a few levels deep) whose leaves come from `leaves` and the usual ones."""
    base = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), ANY_TEXT, *leaves)
    return st.recursive(base, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(ANY_TEXT, inner, max_size=3),
                        max_leaves=8)


JSON_VALUES = json_values(EDGE_NUMBERS, TIMES)


def json_text(value) -> str:
    """`value` as JSON text, NaN and surrogates as json writes them (NaN, "\\ud800")."""
    return json.dumps(value)


def b64_json(value) -> str:
    """A keyset cursor's encoding (apps.trajectories.selectors.cursor_encode) of any JSON value."""
    return base64.urlsafe_b64encode(json_text(value).encode()).decode().rstrip("=")


def nested_json(depth: int) -> str:
    """`depth` nested arrays, as text (too deep for json.dumps past the recursion limit)."""
    return "[" * depth + "]" * depth

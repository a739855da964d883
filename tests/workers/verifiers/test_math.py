"""The math check: math-verify equivalence in a killable worker process, from any thread."""

import threading
import time

import pytest

from workers.definitions.specs import MathMatch
from workers.verifiers import mathcheck
from workers.verifiers.mathcheck import math_check
from workers.verifiers.types import ERROR, FAIL, INFRA_ERROR, PASS, Item, Sample


def check(response, reference, timeout_seconds=5):
    spec = MathMatch(type="math", reference="{answer}", timeout_seconds=timeout_seconds)
    return math_check(spec, Sample(response), Item("k", {}, {"answer": reference}), None)


@pytest.mark.parametrize("response, reference, status", [
    ("7 + 5 = 12\nAnswer: 12", 12, PASS),
    ("The answer is $\\frac{24}{2}$.", 12, PASS),
    ("So we get \\boxed{\\frac{1}{2}}.", "0.5", PASS),
    ("Answer: 0.5", "\\frac{1}{2}", PASS),
    ("Answer: 2\\sqrt{2}", "\\sqrt{8}", PASS),
    ('{"answer": "x^2 + 2x + 1"}', "(x+1)^2", PASS),
    ("Answer: 13", 12, FAIL),
    ("Answer: 1/3", "0.5", FAIL),
])
def test_equivalence(response, reference, status):
    outcome = check(response, reference)
    assert outcome.status == status, outcome.evidence


def test_evidence_names_what_was_read_and_expected():
    outcome = check("Answer: 13", 12)
    assert "13" in outcome.evidence and "expected 12" in outcome.evidence


def test_no_answer_scores_zero():
    outcome = check("I do not know.", 12)
    assert outcome.value == 0 and outcome.status == FAIL


def test_power_tower_is_killed_at_the_timeout_and_the_pool_recovers():
    check("Answer: 1", 1)  # start the pool, so the timing below is the check's own
    started = time.monotonic()
    outcome = check("$\\boxed{2^{2^{2^{2^{2^{100}}}}}}$", 12, timeout_seconds=1)
    assert time.monotonic() - started < 4
    assert outcome.status == FAIL and outcome.value == 0 and "timed out after 1s" in outcome.evidence
    assert check("Answer: 12", 12).status == PASS  # a fresh worker replaced the killed one


def test_runs_outside_the_main_thread():
    # math-verify's own signal-based timeouts would raise ValueError here.
    results = []
    workers = [threading.Thread(target=lambda n=n: results.append((n, check(f"Answer: {n}", n)))) for n in range(4)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(60)
    assert sorted(n for n, outcome in results if outcome.status == PASS) == [0, 1, 2, 3]


def test_hostile_megabyte_response_ends_within_the_timeout():
    started = time.monotonic()
    outcome = check("1+" * 500_000 + "1", 12, timeout_seconds=2)
    assert outcome.status == FAIL and time.monotonic() - started < 5


def test_a_pool_that_cannot_start_is_an_infra_error(monkeypatch):
    def broken_pool():
        raise OSError("cannot fork: resource temporarily unavailable")

    monkeypatch.setattr(mathcheck, "_math_pool", broken_pool)
    outcome = check("Answer: 12", 12)
    assert outcome.status == INFRA_ERROR and outcome.value is None and "cannot fork" in outcome.evidence


def test_reference_faults_are_the_authors():
    missing = math_check(MathMatch(type="math", reference="{solution}"), Sample("Answer: 1"),
                         Item("k", {}, {"answer": 1}), None)
    assert missing.status == ERROR and "solution" in missing.evidence
    unparseable = check("Answer: 1", "")
    assert unparseable.status == ERROR and unparseable.value is None

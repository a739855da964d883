"""Numbers read from free text, and the numeric check's tolerance and percent rules."""

import time
from decimal import Decimal

import pytest

from workers.definitions.specs import NumericMatch
from workers.verifiers.numbers import final_number, numeric_check, parse_numbers
from workers.verifiers.types import ERROR, FAIL, PASS, Item, Sample


@pytest.mark.parametrize("text, expected", [
    ("1.2 million", [("1200000", False)]),
    ("$3.4bn", [("3400000000", False)]),
    ("$3.4 bn", [("3400000000", False)]),
    ("-$2.5M", [("-2500000", False)]),
    ("12k", [("12000", False)]),
    ("1.5 trillion", [("1500000000000", False)]),
    ("15%", [("15", True)]),
    ("15 per cent", [("15", True)]),
    ("0.15", [("0.15", False)]),
    ("12,400", [("12400", False)]),
    ("1,234,567.5", [("1234567.5", False)]),
    ("\u22123.5", [("-3.5", False)]),
    ("1e6", [("1000000", False)]),
    ("2.5E-3", [("0.0025", False)]),
    (".5", [("0.5", False)]),
    ("2021-2024", [("2021", False), ("2024", False)]),  # a range, not a negative number
    ("report-003", [("3", False)]),
    ("5 m long", [("5", False)]),  # metres: single-letter scales must be attached
    ("5min", [("5", False)]),
    ("12 kg", [("12", False)]),
    ("1,2,3", [("1", False), ("2", False), ("3", False)]),  # not a digit group
    ("H2O and v1.2.3", []),
])
def test_scale_parsing(text, expected):
    assert [(str(q.value.normalize().__format__("f")), q.percent) for q in parse_numbers(text)] == expected


@pytest.mark.parametrize("text, expected", [
    ("1.2 million", [("1.2", False)]),
    ("15%", [("15", False)]),
    ("$3.4bn", [("3.4", False)]),
])
def test_without_parse_scale_the_scale_is_ignored(text, expected):
    assert [(format(q.value.normalize(), "f"), q.percent) for q in parse_numbers(text, parse_scale=False)] == expected


@pytest.mark.parametrize("response, value, where", [
    ("3 + 4 = 7, so 7 * 2 = 14.\nAnswer: 14 apples, not 15", 14, "Answer"),
    ("**Final answer:** $12.4 million", 12_400_000, "Answer"),
    ("Answer:\n  42\nthanks", 42, "Answer"),
    ('{"answer": "12.4 million", "citations": [{"doc_id": "r-1", "quote": "up 5% in 2023"}]}', 12_400_000, "JSON"),
    ("so the result is \\boxed{7} (checked 3 times)", 7, "boxed"),
    ("first 3, then 5, finally 8", 8, "last number"),
])
def test_final_number_prefers_marked_answer_then_last(response, value, where):
    quantity, found_in = final_number(response)
    assert quantity.value == value and where in found_in


def check(reference, response, **spec):
    spec = NumericMatch.model_validate({"type": "numeric", "reference": "{answer}", **spec})
    return numeric_check(spec, Sample(response), Item("k", {}, {"answer": reference}), None)


@pytest.mark.parametrize("answer, tolerance, status", [
    ("Answer: 101", {"rel_tolerance": 0.01}, PASS),  # exactly on the relative edge
    ("Answer: 101.0001", {"rel_tolerance": 0.01}, FAIL),
    ("Answer: 98.99", {"rel_tolerance": 0.01}, FAIL),
    ("Answer: 100.5", {"abs_tolerance": 0.5, "rel_tolerance": 0}, PASS),  # exactly on the absolute edge
    ("Answer: 100.51", {"abs_tolerance": 0.5, "rel_tolerance": 0}, FAIL),
    ("Answer: 100.0000000001", {"rel_tolerance": 0}, FAIL),  # exact means exact: no float rounding
    ("Answer: 100.000", {"rel_tolerance": 0}, PASS),
])
def test_tolerance_edges(answer, tolerance, status):
    assert check("100", answer, **tolerance).status == status


def test_scale_is_exact_decimal_not_float():
    # 1.1 * 1e6 is 1100000.0000000002 in floats; with rel_tolerance 0 that would fail.
    assert check("1100000", "Answer: 1.1 million", rel_tolerance=0).status == PASS
    assert check("1.1 million", "Answer: $1,100,000", rel_tolerance=0).status == PASS
    assert check("1.1 million", "Answer: 1.1", rel_tolerance=0.001).status == FAIL  # the scale is not optional


@pytest.mark.parametrize("reference, answer, status", [
    ("15%", "15%", PASS),
    ("15%", "15", PASS),  # percent points
    ("15%", "0.15", PASS),  # a fraction
    ("15%", "0.15%", FAIL),
    ("15%", "1500", FAIL),
    ("0.15", "15%", PASS),  # a plain reference reads the percent as a fraction...
    ("0.15", "15", FAIL),
    ("15", "15%", FAIL),  # ...so 15% is 0.15, not 15
    ("0.5", "0.5%", FAIL),
    ("-3.2%", "Answer: \u22123.2%", PASS),
])
def test_percent_rule_follows_the_reference(reference, answer, status):
    assert check(reference, answer, rel_tolerance=0).status == status


def test_percent_tolerance_is_in_percent_points():
    assert check("15%", "Answer: 0.151", abs_tolerance=0.1, rel_tolerance=0).status == PASS  # 15.1 points
    assert check("15%", "Answer: 0.152", abs_tolerance=0.1, rel_tolerance=0).status == FAIL


def test_parse_scale_off_compares_the_written_numbers():
    assert check(42, "Answer: 42", rel_tolerance=0, parse_scale=False).status == PASS
    assert check("12", "Answer: 12 million", parse_scale=False).status == PASS
    assert check("12000000", "Answer: 12 million", parse_scale=False).status == FAIL


def test_evidence_names_found_and_expected():
    outcome = check("12.4 million", '{"answer": "13.4 million"}', rel_tolerance=0.001)
    assert outcome.value == 0 and outcome.status == FAIL
    assert "13.4 million" in outcome.evidence and "12.4 million" in outcome.evidence
    assert "JSON answer" in outcome.evidence and "off by 1000000, allowed 12400" in outcome.evidence


def test_no_number_scores_zero_and_says_so():
    outcome = check("7", "I cannot answer that.")
    assert outcome.value == 0 and "no number" in outcome.evidence


def test_authoring_faults_are_errors_not_zeros():
    missing = numeric_check(NumericMatch(type="numeric", reference="{total}"), Sample("Answer: 3"),
                            Item("k", {}, {"answer": 3}), None)
    assert missing.status == ERROR and missing.value is None and "total" in missing.evidence
    not_a_number = check("seven", "Answer: 7")
    assert not_a_number.status == ERROR and "holds no number" in not_a_number.evidence


def test_hostile_megabyte_response_reads_its_last_number_quickly():
    response = ("word " * 200_000) + "so 41 then 42"
    started = time.monotonic()
    outcome = check("42", response)
    assert outcome.status == PASS and time.monotonic() - started < 2


def test_hostile_ten_thousand_numbers():
    response = " ".join(str(n) for n in range(10_000))
    started = time.monotonic()
    assert len(parse_numbers(response)) == 10_000
    assert check("9999", response).status == PASS
    assert time.monotonic() - started < 2


@pytest.mark.parametrize("response", [
    "Answer: " + "9" * 200_000,
    "Answer: 1e999 trillion",
    "Answer: " + "1," * 100_000 + "000",
])
def test_hostile_huge_numbers_score_without_raising(response):
    started = time.monotonic()
    outcome = check("42", response)
    assert outcome.status == FAIL and time.monotonic() - started < 2
    assert len(outcome.evidence) < 500


def test_quantity_keeps_exact_value():
    [quantity] = parse_numbers("$12.4 million")
    assert quantity.value == Decimal("12400000") and quantity.text == "$12.4 million"

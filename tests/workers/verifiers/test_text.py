"""string_check, regex, json_schema and text_similarity on ordinary and hostile responses."""

import threading
import time

import pytest

from workers.verifiers.checks import SPEC_CLASSES, check_function
from workers.verifiers.text import REGEX_SECONDS, bleu, cosine, fuzzy_match, rouge_l
from workers.verifiers.types import ERROR, FAIL, PASS, Context, Item, Sample

ITEM = Item("k", {}, {"answer": "Paris", "city": "Lyon"})


def run(spec, response, item=ITEM, context=None):
    typed = SPEC_CLASSES[spec["type"]].model_validate(spec)
    return check_function(spec["type"])(typed, Sample(response), item, context or Context())


@pytest.mark.parametrize("operation, response, status", [
    ("eq", "Paris", PASS),
    ("eq", "Paris\n", FAIL),  # OpenAI semantics: eq is exact, no trimming
    ("eq", "paris", FAIL),
    ("ne", "Lyon", PASS),
    ("ne", "Paris", FAIL),
    ("like", "The capital is Paris.", PASS),
    ("like", "The capital is PARIS.", FAIL),  # like is case-sensitive
    ("ilike", "The capital is PARIS.", PASS),
    ("ilike", "The capital is Rome.", FAIL),
])
def test_string_check_operations(operation, response, status):
    outcome = run({"type": "string_check", "operation": operation, "reference": "{answer}"}, response)
    assert outcome.status == status and outcome.value == (1.0 if status == PASS else 0.0)


def test_string_check_reference_from_another_hidden_field_and_missing_field():
    assert run({"type": "string_check", "operation": "like", "reference": "{city}"}, "in Lyon").status == PASS
    missing = run({"type": "string_check", "reference": "{country}"}, "France")
    assert missing.status == ERROR and missing.value is None and "country" in missing.evidence


def test_regex_searches_anywhere():
    spec = {"type": "regex", "pattern": r"Answer:\s*\d+$"}
    assert run(spec, "working...\nAnswer: 42").value == 1
    outcome = run(spec, "Answer: forty-two")
    assert outcome.value == 0 and "no match" in outcome.evidence


def test_catastrophic_regex_times_out_off_the_main_thread():
    spec = {"type": "regex", "pattern": r"^(a|aa)+$"}
    results = []
    started = time.monotonic()
    worker = threading.Thread(target=lambda: results.append(run(spec, "a" * 60 + "b")))
    worker.start()
    worker.join(REGEX_SECONDS + 10)
    assert not worker.is_alive() and time.monotonic() - started < REGEX_SECONDS + 4
    [outcome] = results
    assert outcome.status == FAIL and outcome.value == 0 and "timed out" in outcome.evidence


def test_regex_timeout_respects_a_shorter_context_deadline():
    started = time.monotonic()
    outcome = run({"type": "regex", "pattern": r"^(a|aa)+$"}, "a" * 60 + "b", context=Context(timeout_seconds=0.2))
    assert "timed out after 0.2s" in outcome.evidence and time.monotonic() - started < 1.5


def test_regex_on_a_megabyte_response():
    response = "x" * 1_000_000 + " Answer: 7"
    started = time.monotonic()
    assert run({"type": "regex", "pattern": r"Answer: \d"}, response).value == 1
    assert time.monotonic() - started < 1


SCHEMA = {"type": "object", "required": ["name", "age"],
          "properties": {"name": {"type": "string"}, "age": {"type": "integer", "minimum": 0},
                         "tags": {"type": "array", "items": {"type": "string"}}}}


@pytest.mark.parametrize("response, value", [
    ('{"name": "Ada", "age": 36}', 1),
    ('Here you go:\n```json\n{"name": "Ada", "age": 36}\n```\nAnything else?', 1),
    ('Sure! {"name": "Ada", "age": 36} is the record.', 1),
    ('```\n{"name": "Ada", "age": 36}\n```', 1),
    ('{"name": "Ada"}', 0),
    ("no json here", 0),
])
def test_json_schema_reads_plain_fenced_and_embedded_json(response, value):
    assert run({"type": "json_schema", "json_schema": SCHEMA}, response).value == value


def test_json_schema_evidence_names_the_failing_path():
    outcome = run({"type": "json_schema", "json_schema": SCHEMA}, '{"name": "Ada", "age": 36, "tags": ["a", 7]}')
    assert outcome.status == FAIL and "$.tags[1]" in outcome.evidence and "not of type 'string'" in outcome.evidence
    outcome = run({"type": "json_schema", "json_schema": SCHEMA}, '{"name": "Ada", "age": -1}')
    assert "$.age" in outcome.evidence and "minimum" in outcome.evidence


def test_json_schema_unparseable_json_says_why():
    outcome = run({"type": "json_schema", "json_schema": SCHEMA}, '```json\n{"name": "Ada", "age": }\n```')
    assert outcome.value == 0 and "does not parse" in outcome.evidence


@pytest.mark.parametrize("depth", [500, 100_000])
def test_deeply_nested_json_fails_without_raising(depth):
    response = "[" * depth + "]" * depth
    outcome = run({"type": "json_schema", "json_schema": {"type": "object"}}, response)
    assert outcome.status == FAIL and outcome.value == 0


def test_deep_json_against_a_recursive_schema_fails_without_raising():
    schema = {"$ref": "#/$defs/node", "$defs": {"node": {"type": "array", "items": {"$ref": "#/$defs/node"}}}}
    outcome = run({"type": "json_schema", "json_schema": schema}, "[" * 900 + "]" * 900)
    assert outcome.value in (0, 1) and outcome.status in (PASS, FAIL)  # either verdict, but never an exception


def test_invalid_schema_is_the_authors_error():
    outcome = run({"type": "json_schema", "json_schema": {"type": "no-such-type"}}, "{}")
    assert outcome.status == ERROR and outcome.value is None


def test_rouge_l_is_the_f1_of_the_longest_common_subsequence():
    # LCS("the cat on the mat", "the cat sat on the mat") = 5 tokens: P = 5/5, R = 5/6.
    assert rouge_l("The cat on the mat", "the cat sat on the mat") == pytest.approx(2 * 1 * (5 / 6) / (1 + 5 / 6))
    assert rouge_l("mat the on", "the cat sat on the mat") == pytest.approx(2 * (2 / 3) * (2 / 6) / (2 / 3 + 2 / 6))
    assert rouge_l("", "anything") == 0


def test_cosine_over_token_counts():
    assert cosine("a a b", "a b") == pytest.approx(3 / (5 ** 0.5 * 2 ** 0.5))
    assert cosine("x y", "p q") == 0 and cosine("", "") == 0


def test_bleu_and_fuzzy_bounds():
    sentence = "the quick brown fox jumps over the lazy dog"
    assert bleu(sentence, sentence) == pytest.approx(1.0)
    assert bleu("completely unrelated words here", sentence) < 0.1
    assert fuzzy_match("kitten", "sitting") == pytest.approx(1 - 5 / 13)  # Indel distance 5 over 13 characters


@pytest.mark.parametrize("metric", ["fuzzy_match", "bleu", "rouge_l", "cosine"])
def test_text_similarity_scores_the_similarity_and_passes_at_threshold(metric):
    item = Item("k", {}, {"answer": "the quick brown fox jumps over the lazy dog"})
    same = run({"type": "text_similarity", "metric": metric, "pass_threshold": 1.0},
               "the quick brown fox jumps over the lazy dog", item)
    assert same.status == PASS and same.value == pytest.approx(1.0)
    near = run({"type": "text_similarity", "metric": metric, "pass_threshold": 0.5},
               "the quick brown fox leaps over the lazy dog", item)
    assert 0.5 <= near.value < 1 and near.status == PASS  # partial similarity is still the score
    strict = run({"type": "text_similarity", "metric": metric, "pass_threshold": 0.99},
                 "the quick brown fox leaps over the lazy dog", item)
    assert strict.value == near.value and strict.status == FAIL


@pytest.mark.parametrize("metric", ["fuzzy_match", "bleu", "rouge_l", "cosine"])
def test_text_similarity_on_a_megabyte_response(metric):
    item = Item("k", {}, {"answer": "the quick brown fox"})
    started = time.monotonic()
    outcome = run({"type": "text_similarity", "metric": metric}, "lorem ipsum dolor " * 60_000, item)
    assert outcome.status == FAIL and 0 <= outcome.value < 0.5 and time.monotonic() - started < 5

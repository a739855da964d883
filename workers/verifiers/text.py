"""Checks on the response as text: `string_check`, `regex`, `json_schema` and `text_similarity`.

- string_check follows OpenAI's string_check grader: eq and ne compare the whole response with the reference
  exactly (no trimming), like is a case-sensitive substring test, ilike a case-insensitive one. 1 or 0.
- regex searches the response (the `regex` package, whose syntax is a superset of `re`'s) and scores 1 on a
  match. The pattern is the author's but the text is the policy's, so the search runs under a time limit that
  works in any thread (regex's own timeout); a pattern that runs past it on this response scores 0.
- json_schema reads the response's JSON (answers.json_payload: whole response, a fenced block, or the outer
  braces) and validates it with `jsonschema` under the schema's own draft. The evidence is the most relevant
  error (jsonschema's best_match) with its path.
- text_similarity scores the similarity itself in [0, 1]; the status is pass at or above pass_threshold.
  Metrics: fuzzy_match (rapidfuzz's normalised Indel ratio), bleu (sacrebleu's sentence BLEU, 13a tokens,
  exponential smoothing), rouge_l (F1 of the longest common token subsequence, via rapidfuzz's LCSseq), cosine
  (over token counts). rouge_l and cosine tokens are lowercase runs of letters and digits.
"""

from __future__ import annotations

import math
import re
from collections import Counter

import jsonschema
import regex
import sacrebleu
from jsonschema.exceptions import SchemaError, best_match
from rapidfuzz import fuzz
from rapidfuzz.distance import LCSseq

from workers.definitions.specs import JsonSchemaCheck, RegexMatch, StringCheck, TextSimilarity

from .answers import ReferenceMissing, json_payload, preview, reference_text
from .types import ERROR, FAIL, PASS, Item, Outcome, Sample

REGEX_SECONDS = 1.0  # ample for any sane pattern on a 1 MB response; catastrophic backtracking needs far more
TOKEN = re.compile(r"[^\W_]+")


def string_check(spec: StringCheck, sample: Sample, item: Item, context) -> Outcome:
    try:
        reference = reference_text(spec.reference, item)
    except ReferenceMissing as exc:
        return Outcome(value=None, status=ERROR, evidence=str(exc))
    operation, response = spec.operation, sample.response
    passed = {
        "eq": lambda: response == reference,
        "ne": lambda: response != reference,
        "like": lambda: reference in response,
        "ilike": lambda: reference.casefold() in response.casefold(),
    }[operation]()
    verb = {"eq": "equal", "ne": "differ from", "like": "contain", "ilike": "contain (any case)"}[operation]
    return Outcome.scored(passed, f"response {preview(response)} {'does' if passed else 'does not'} {verb} "
                                  f"the reference {preview(reference)}")


def regex_check(spec: RegexMatch, sample: Sample, item: Item, context) -> Outcome:
    try:
        pattern = regex.compile(spec.pattern)
    except regex.error as exc:
        return Outcome(value=None, status=ERROR, evidence=f"pattern {spec.pattern!r} does not compile: {exc}")
    seconds = min(REGEX_SECONDS, getattr(context, "timeout_seconds", REGEX_SECONDS) or REGEX_SECONDS)
    try:
        match = pattern.search(sample.response, timeout=seconds)
    except TimeoutError:
        return Outcome.scored(0, f"pattern {spec.pattern!r} timed out after {seconds:g}s on this response "
                                 f"(catastrophic backtracking); scored as no match")
    if match is None:
        return Outcome.scored(0, f"no match for {spec.pattern!r} in {preview(sample.response)}")
    return Outcome.scored(1, f"{spec.pattern!r} matched {preview(match.group(0), 80)} at {match.start()}")


def json_schema_check(spec: JsonSchemaCheck, sample: Sample, item: Item, context) -> Outcome:
    schema = spec.json_schema
    try:
        validator_class = jsonschema.validators.validator_for(schema)
        validator_class.check_schema(schema)
    except SchemaError as exc:
        return Outcome(value=None, status=ERROR, evidence=f"json_schema is not a valid schema: {exc.message}")
    payload, problem = json_payload(sample.response)
    if problem:
        return Outcome.scored(0, f"{problem}; response {preview(sample.response)}")
    try:
        error = best_match(validator_class(schema).iter_errors(payload))
    except RecursionError:
        return Outcome.scored(0, "the JSON is nested too deeply to validate")
    if error is None:
        return Outcome.scored(1, "the JSON matches the schema")
    return Outcome.scored(0, f"at {error.json_path}: {error.message[:300]}")


def fuzzy_match(response: str, reference: str) -> float:
    return fuzz.ratio(response, reference) / 100


def bleu(response: str, reference: str) -> float:
    return sacrebleu.sentence_bleu(response, [reference]).score / 100


def rouge_l(response: str, reference: str) -> float:
    candidate, target = _tokens(response), _tokens(reference)
    if not candidate or not target:
        return 0.0
    common = LCSseq.similarity(candidate, target)
    if common == 0:
        return 0.0
    precision, recall = common / len(candidate), common / len(target)
    return 2 * precision * recall / (precision + recall)


def cosine(response: str, reference: str) -> float:
    """Hand-written: the formula is one line over two Counters; no package adds anything to it."""
    a, b = Counter(_tokens(response)), Counter(_tokens(reference))
    norms = math.sqrt(sum(n * n for n in a.values())) * math.sqrt(sum(n * n for n in b.values()))
    return sum(n * b[token] for token, n in a.items()) / norms if norms else 0.0


def _tokens(text: str) -> list[str]:
    return TOKEN.findall(text.lower())


METRICS = {"fuzzy_match": fuzzy_match, "bleu": bleu, "rouge_l": rouge_l, "cosine": cosine}


def text_similarity_check(spec: TextSimilarity, sample: Sample, item: Item, context) -> Outcome:
    try:
        reference = reference_text(spec.reference, item)
    except ReferenceMissing as exc:
        return Outcome(value=None, status=ERROR, evidence=str(exc))
    metric, threshold = spec.metric, spec.pass_threshold
    similarity = min(1.0, max(0.0, METRICS[metric](sample.response, reference)))
    passed = similarity >= threshold
    return Outcome(value=similarity, status=PASS if passed else FAIL,
                   evidence=f"{metric} {similarity:.3f} {'>=' if passed else '<'} {threshold:g} against "
                            f"{preview(reference)}")

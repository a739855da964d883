"""Model output with Windows line endings ("\\r\\n": a browser's textarea, a model trained on such text) reads as
it does with "\\n": the code block, the JSON block, the answer line, the citation lines, an author's regex and
reference, and the hidden tests run on the code."""

import pytest

from tests.support.sandbox import process_pool
from workers.definitions.specs import parse_spec
from workers.sandbox import SandboxImage
from workers.verifiers import Context, Item, Sample, verify
from workers.verifiers.answers import final_answer, json_payload
from workers.verifiers.documents import response_citations
from workers.verifiers.unit_tests import candidate_source

ADD = "def add(a, b):\n    return a + b\n"


def crlf(text: str) -> str:
    return text.replace("\n", "\r\n")


def test_the_last_python_block_is_found():
    response = crlf(f"Here it is:\n```python\n{ADD}```\nDone.\n")
    assert candidate_source(Sample(response=response)).splitlines() == ADD.splitlines()


def test_a_fenced_json_block_is_read_when_the_prose_around_it_has_braces():
    payload, problem = json_payload(crlf('Set {x} aside.\n```json\n{"answer": 4}\n```\n'))
    assert (payload, problem) == ({"answer": 4}, "")


def test_the_line_after_an_answer_marker_is_the_answer():
    answer = final_answer(crlf("Working it out.\nFinal answer:\n42\nbecause 6 * 7.\n"))
    assert (answer.text, answer.source) == ("42", "marker")


def test_citation_lines_are_read_one_a_line():
    citations, _, _ = response_citations(crlf('[report-003] "Revenue for fiscal 2023 was $12.4 million"\n'
                                              '[report-004] "Costs rose by a tenth over the year"\nAnswer: 12.4\n'))
    assert [(c.doc_id, c.quote) for c in citations] == [("report-003", "Revenue for fiscal 2023 was $12.4 million"),
                                                        ("report-004", "Costs rose by a tenth over the year")]


def test_an_authors_pattern_and_reference_see_one_line_ending():
    spec = parse_spec("verifier", {"pass_threshold": 1.0, "layers": [{"name": "exact", "kind": "exact", "checks": [
        {"type": "regex", "name": "first-line", "weight": 1.0, "pattern": r"(?m)^items: 3$"},
        {"type": "string_check", "name": "whole", "weight": 1.0, "operation": "eq", "reference": "{answer}"}]}]})
    item = Item(key="k", inputs={}, hidden={"answer": "items: 3\ntotal: 12"})
    verdict = verify(spec, Sample(response="items: 3\r\ntotal: 12"), item, Context())
    assert [c.value for c in verdict.components] == [1.0, 1.0], [c.evidence for c in verdict.components]


@pytest.mark.sandbox
def test_a_correct_function_pasted_with_crlf_passes_its_hidden_tests():
    image = SandboxImage(key="sandbox_image/plain-python@1", layers=({"type": "base", "image": "python-3.11"},),
                         warm_pool_size=1)
    spec = parse_spec("verifier", {"pass_threshold": 1.0, "layers": [{"name": "exact", "kind": "exact", "checks": [
        {"type": "unit_tests", "name": "hidden-tests", "weight": 1.0, "timeout_seconds": 10}]}]})
    item = Item(key="add", inputs={}, hidden={"test": "def check(candidate):\n    assert candidate(2, 3) == 5\n",
                                              "entry_point": "add"})
    with process_pool(image) as pool:
        verdict = verify(spec, Sample(response=crlf(f"```python\n{ADD}```\n")), item, Context(pool=pool, image=image))
    assert (verdict.reward, verdict.status) == (1.0, "pass"), verdict.components[0].evidence

"""The citations check against documents mounted by a sandbox image's files layer."""

import json
import time

import pytest

from workers.definitions.specs import Citations
from workers.sandbox import SandboxImage
from workers.verifiers.documents import MAX_CITATIONS, citations_check, image_documents, normalise
from workers.verifiers.types import ERROR, FAIL, INFRA_ERROR, PARTIAL, PASS, Context, Item, Sample

REPORT_1 = ("NORTHWIND FOODS - ANNUAL REPORT, FISCAL 2023\n\n"
            "Revenue for fiscal 2023 was $12.4 million, up 5% from $11.8 million in fiscal 2022.\n\n"
            "Operating margin was \u22123.2% for the year.\n\n"
            "At the end of fiscal 2023 the company employed 1,234 people across 3 offices.\n")
REPORT_2 = ("BLUEFIN ROBOTICS - ANNUAL REPORT, FISCAL 2022\n\n"
            "Research and development spending was $4.1 million.\n\n"
            "At the end of fiscal 2022 the company employed 310 people across 1 office.\n")
IMAGE = SandboxImage(key="sandbox_image/reports@1", layers=(
    {"type": "base", "image": "python-3.11-slim"},
    {"type": "files", "files": {"docs/report-001.txt": REPORT_1, "docs/report-002.txt": REPORT_2,
                                "docs/INDEX.tsv": "report-001\tNorthwind Foods\nreport-002\tBluefin Robotics\n"}},
))
SPEC = Citations(type="citations", fuzzy_threshold=0.9, check_numbers=True)
ITEM = Item("report-001-revenue", {}, {"answer": "12.4 million"})


def cite(answer, *citations, spec=SPEC, image=IMAGE):
    response = json.dumps({"answer": answer, "citations": [{"doc_id": d, "quote": q} for d, q in citations]})
    return citations_check(spec, Sample(response), ITEM, Context(image=image))


def test_documents_are_found_by_path_and_by_name():
    documents = image_documents(IMAGE)
    assert documents["report-001"] == documents["docs/report-001.txt"] == REPORT_1
    assert "INDEX" in documents and "python-3.11-slim" not in documents


def test_exact_quote_passes():
    outcome = cite("$12.4 million", ("report-001", "Revenue for fiscal 2023 was $12.4 million, up 5% from "
                                                   "$11.8 million in fiscal 2022."))
    assert outcome.status == PASS and outcome.value == 1 and "exact" in outcome.evidence


@pytest.mark.parametrize("quote", [
    "revenue  for fiscal 2023 was $12.4 MILLION,\nup 5% from $11.8 million",  # case and whitespace
    "Operating margin was -3.2% for the year",  # a plain hyphen for the document's minus sign
    "Revenue for fiscal 2023 was $12.4 million, up 5% from $11.8 million in fiscal 2022.".replace(",", "\uff0c"),
])
def test_normalised_quotes_match_exactly(quote):
    outcome = cite("12.4 million" if "Revenue" in quote or "revenue" in quote else "-3.2%", ("report-001", quote))
    assert outcome.status == PASS, outcome.evidence
    assert "exact" in outcome.evidence


def test_curly_quotes_and_dashes_normalise():
    assert normalise("\u201cUp\u201d \u2013 it\u2019s   here") == normalise('"up" - it\'s here')


def test_fuzzy_quote_passes_above_the_threshold_and_fails_below():
    paraphrase = "Revenue for fiscal 2023 came to $12.4 million, up 5% from $11.8 million in fiscal 2022."
    assert cite("12.4 million", ("report-001", paraphrase)).status == PASS
    strict = cite("12.4 million", ("report-001", paraphrase), spec=SPEC.model_copy(update={"fuzzy_threshold": 0.99}))
    assert strict.value == 0 and "best fuzzy match" in strict.evidence


def test_unfound_quote_and_unknown_document_are_named():
    outcome = cite("12.4 million",
                   ("report-001", "Revenue for fiscal 2023 was $12.4 million, up 5% from $11.8 million."),
                   ("report-002", "Revenue grew fourfold on the back of a record harvest."),
                   ("report-999", "Revenue for fiscal 2023 was $12.4 million."))
    assert outcome.status == PARTIAL and outcome.value == pytest.approx((1 / 3 + 1) / 2)
    assert "1/3 citations found" in outcome.evidence
    assert "record harvest" in outcome.evidence and "report-999" in outcome.evidence
    assert "no such document" in outcome.evidence


def test_quote_from_the_wrong_document_is_not_found():
    outcome = cite("4.1 million", ("report-001", "Research and development spending was $4.1 million."))
    assert outcome.value == 0 and "not found" in outcome.evidence


def test_number_mismatch_halves_the_score_and_names_the_number():
    outcome = cite("13.4 million", ("report-001", "Revenue for fiscal 2023 was $12.4 million, up 5% from "
                                                  "$11.8 million in fiscal 2022."))
    assert outcome.value == pytest.approx(0.5) and "not in the cited text: 13.4 million" in outcome.evidence


def test_numbers_compare_by_value_after_scale():
    quote = ("report-001", "Revenue for fiscal 2023 was $12.4 million, up 5% from $11.8 million in fiscal 2022.")
    assert cite("$12,400,000", quote).value == 1
    assert cite("12.4m", quote).value == 1
    assert cite("1.24 billion", quote).value == pytest.approx(0.5)


def test_fuzzy_quote_that_changes_a_figure_does_not_vouch_for_it():
    # 96% similar to the document's sentence, but the document says 12.4: the cited source text decides.
    doctored = "Revenue for fiscal 2023 was $13.4 million, up 5% from $11.8 million in fiscal 2022."
    outcome = cite("13.4 million", ("report-001", doctored))
    assert "fuzzy" in outcome.evidence and outcome.value == pytest.approx(0.5)
    assert "not in the cited text: 13.4 million" in outcome.evidence


def test_check_numbers_off_scores_citations_only():
    outcome = cite("99", ("report-001", "Operating margin was \u22123.2% for the year."),
                   spec=SPEC.model_copy(update={"check_numbers": False}))
    assert outcome.value == 1


def test_bare_number_quote_proves_nothing():
    outcome = cite("12.4 million", ("report-001", "$12.4 million"))
    assert outcome.value == 0 and "shorter than" in outcome.evidence


def test_line_form_citations():
    response = ("The company employed 1,234 people.\n"
                '[report-001] "At the end of fiscal 2023 the company employed 1,234 people across 3 offices."\n')
    outcome = citations_check(SPEC, Sample(response), ITEM, Context(image=IMAGE))
    assert outcome.status == PASS, outcome.evidence
    marked = ('Answer: 1,300 people\n[report-001] \u201cAt the end of fiscal 2023 the company employed 1,234 people'
              ' across 3 offices.\u201d')
    outcome = citations_check(SPEC, Sample(marked), ITEM, Context(image=IMAGE))
    assert outcome.value == pytest.approx(0.5) and "1,300" in outcome.evidence


def test_no_citations_scores_zero():
    outcome = citations_check(SPEC, Sample("Revenue was $12.4 million."), ITEM, Context(image=IMAGE))
    assert outcome.status == FAIL and "cites nothing" in outcome.evidence
    outcome = citations_check(SPEC, Sample('{"answer": "1", "citations": "report-001"}'), ITEM,
                                  Context(image=IMAGE))
    assert outcome.status == FAIL and "not a list" in outcome.evidence


def test_missing_machinery_and_missing_documents():
    assert citations_check(SPEC, Sample("x"), ITEM, Context()).status == INFRA_ERROR
    bare = SandboxImage(key="sandbox_image/bare@1", layers=({"type": "base", "image": "python-3.11-slim"},))
    outcome = cite("1", ("report-001", "whatever it says here"), image=bare)
    assert outcome.status == ERROR and outcome.value is None and "files layer" in outcome.evidence


def test_hostile_citation_flood_ends_quickly():
    started = time.monotonic()
    flood = [("report-001", f"made up sentence number {n} about revenue") for n in range(10_000)]
    outcome = cite("1", *flood)
    assert outcome.value == 0 and str(MAX_CITATIONS) in outcome.evidence and time.monotonic() - started < 2


def test_hostile_megabyte_quote_and_ten_thousand_numbers():
    started = time.monotonic()
    huge = cite("12.4 million", ("report-001", "Revenue " * 130_000))
    numbers = cite(" ".join(str(n) for n in range(10_000)),
                   ("report-001", "At the end of fiscal 2023 the company employed 1,234 people across 3 offices."))
    assert huge.value == 0 and "longer than the document" in huge.evidence
    assert 0.5 <= numbers.value < 0.51 and len(numbers.evidence) < 2000
    assert time.monotonic() - started < 5


def test_every_demo_question_passes_with_its_own_hidden_citations():
    """The real docqa corpus and image: a response that quotes the hidden spans and gives the hidden answer
    passes, except cross-document questions, whose computed difference no report states (0.5: the judge's band)."""
    from apps.demo.docqa import corpus, instances
    from apps.demo.images import docqa_image

    image = SandboxImage.from_spec("sandbox_image/docqa-corpus@1", docqa_image())
    values = {}
    for instance in instances(corpus()):
        hidden = instance["hidden"]
        response = json.dumps({"answer": hidden["answer"], "citations": [
            {"doc_id": c["doc_id"], "quote": c["span"]} for c in hidden["citations"]]})
        outcome = citations_check(SPEC, Sample(response), Item(instance["key"], instance["inputs"], hidden),
                                      Context(image=image))
        values[instance["key"]] = outcome.value
    single = [v for key, v in values.items() if not key.startswith("compare-")]
    compare = [v for key, v in values.items() if key.startswith("compare-")]
    assert len(single) > 300 and set(single) == {1.0}
    assert compare and set(compare) == {0.5}

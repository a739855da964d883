"""The `citations` check: every span the response quotes must be in the mounted source documents, and every
number of its answer must be in the text it cites.

How a response cites, first form found wins:
- JSON (answers.json_payload): {"answer": "12.4 million", "citations": [{"doc_id": "report-003",
  "quote": "Revenue for fiscal 2023 was $12.4 million, ..."}]}; the answer's numbers are the "answer" field's.
- Lines: [report-003] "Revenue for fiscal 2023 was $12.4 million, ..." (straight or curly quotes), one citation a
  line; the answer is the marked final answer (answers.final_answer), else the response without those lines.
A doc_id names a file of the image's files layers by its path ("docs/report-003.txt") or, where unambiguous,
by its file name without extension ("report-003").

A quote is found when, normalised (NFKC, case folded, curly quotes and dashes made plain, whitespace runs made
one space), it occurs in the normalised document; failing that, when rapidfuzz's partial_ratio against the
document reaches fuzzy_threshold * 100 (quotes longer than the document are never fuzzy-found). A quote under
MIN_QUOTE_WORDS words proves nothing (a bare "12.4 million" is in many reports) and is not found.
With check_numbers, each number of the answer (numbers.py, scale parsed) must equal a number of the document
text the found quotes cover: the document's own span, so a fuzzy quote that changed a figure does not vouch
for it.
value = share of citations found; with check_numbers and numbers in the answer, the mean of that and the share
of answer numbers supported. A response citing nothing scores 0.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass

from rapidfuzz import fuzz

from workers.definitions.specs import Citations

from .answers import final_answer, json_payload, preview
from .numbers import parse_numbers, same_number
from .types import ERROR, INFRA_ERROR, Item, Outcome, Sample

MIN_QUOTE_WORDS = 4
MAX_CITATIONS = 100  # bounds the fuzzy search a hostile response can ask for
CITATION_LINE = re.compile(r"^[ \t>*-]*\[(?P<doc_id>[^\]\n]{1,200})\][ \t:]*[\"“](?P<quote>[^\"”\n]+)[\"”]", re.M)
PLAIN = str.maketrans({"‘": "'", "’": "'", "‚": "'", "‛": "'", "“": '"', "”": '"', "„": '"', "‟": '"',
                       "‐": "-", "‑": "-", "‒": "-", "–": "-", "—": "-", "―": "-", "−": "-"})


@dataclass(frozen=True)
class Citation:
    doc_id: str
    quote: str


def normalise(text: str) -> str:
    return " ".join(unicodedata.normalize("NFKC", text).translate(PLAIN).casefold().split())


def image_documents(image) -> dict[str, str]:
    """doc_id -> text, from the files layers of a workers.sandbox.SandboxImage (our own trusted files: read
    from the spec, no sandbox needed)."""
    files = {path: text for layer in image.layers if layer.get("type") == "files"
             for path, text in layer["files"].items()}
    by_stem: dict[str, list[str]] = {}
    for path in files:
        by_stem.setdefault(path.rsplit("/", 1)[-1].rsplit(".", 1)[0], []).append(path)
    stems = {stem: files[paths[0]] for stem, paths in by_stem.items() if len(paths) == 1 and stem not in files}
    return {**stems, **files}


def response_citations(response: str) -> tuple[list[Citation], str, str]:
    """(citations, answer text, problem): the citations in either form of the module docstring."""
    payload, _ = json_payload(response)
    if isinstance(payload, dict) and "citations" in payload:
        raw = payload["citations"]
        if not isinstance(raw, list):
            return [], "", "the JSON 'citations' is not a list"
        citations = [Citation(str(c.get("doc_id", "")), str(c.get("quote", ""))) if isinstance(c, dict)
                     else Citation("", "") for c in raw]
        answer = payload.get("answer", "")
        return citations, answer if isinstance(answer, str) else str(answer), ""
    citations = [Citation(m["doc_id"].strip(), m["quote"]) for m in CITATION_LINE.finditer(response)]
    answer = final_answer(response)
    return citations, answer.text if answer.narrowed else CITATION_LINE.sub("", response), ""


def locate(quote: str, document: str, fuzzy_threshold: float) -> tuple[str | None, str]:
    """(the normalised document text the quote covers or None, how it was or was not found)."""
    needle, haystack = normalise(quote), normalise(document)
    if len(needle.split()) < MIN_QUOTE_WORDS:
        return None, f"shorter than {MIN_QUOTE_WORDS} words"
    if needle in haystack:
        return needle, "exact"
    if len(needle) > len(haystack):
        return None, "longer than the document"
    alignment = fuzz.partial_ratio_alignment(needle, haystack, score_cutoff=fuzzy_threshold * 100)
    if alignment is None:
        best = fuzz.partial_ratio(needle, haystack)
        return None, f"best fuzzy match {best:.0f} < {fuzzy_threshold * 100:.0f}"
    return haystack[alignment.dest_start:alignment.dest_end], f"fuzzy {alignment.score:.0f}"


def citations_check(spec: Citations, sample: Sample, item: Item, context) -> Outcome:
    image = getattr(context, "image", None)
    if image is None:
        return Outcome(value=None, status=INFRA_ERROR, evidence="no sandbox image in the context to read the "
                                                                  "source documents from")
    documents = image_documents(image)
    if not documents:
        return Outcome(value=None, status=ERROR, evidence=f"image {getattr(image, 'key', '?')} has no files layer: "
                                                          "the citations check needs the documents mounted there")
    citations, answer, problem = response_citations(sample.response)
    if problem or not citations:
        return Outcome.scored(0, problem or f"the response cites nothing: {preview(sample.response)}")
    if len(citations) > MAX_CITATIONS:
        return Outcome.scored(0, f"{len(citations)} citations; at most {MAX_CITATIONS} are read")
    threshold = spec.fuzzy_threshold
    covered, unmatched, notes = [], [], []
    for citation in citations:
        document = documents.get(citation.doc_id)
        if document is None:
            unmatched.append(f"[{citation.doc_id}] {preview(citation.quote, 80)}: no such document")
            continue
        span, how = locate(citation.quote, document, threshold)
        if span is None:
            unmatched.append(f"[{citation.doc_id}] {preview(citation.quote, 80)}: {how}")
        else:
            covered.append(span)
            notes.append(how)
    shares = [len(covered) / len(citations)]
    evidence = [f"{len(covered)}/{len(citations)} citations found ({', '.join(notes) or 'none'})"]
    evidence += [f"not found: {u}" for u in unmatched]
    if spec.check_numbers:
        answer_numbers = parse_numbers(answer)
        cited_numbers = [n for span in covered for n in parse_numbers(span)]
        unsupported = [a for a in answer_numbers if not any(same_number(a, c) for c in cited_numbers)]
        if answer_numbers:
            shares.append(1 - len(unsupported) / len(answer_numbers))
            evidence.append(f"{len(answer_numbers) - len(unsupported)}/{len(answer_numbers)} answer numbers in "
                            "the cited text")
        evidence += [f"not in the cited text: {a.show()}" for a in unsupported[:10]]
    return Outcome.scored(sum(shares) / len(shares), "; ".join(evidence))

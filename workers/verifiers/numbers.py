"""Numbers in free text, with their scale, and the `numeric` check.

What is read as a number: "12,400" (commas only in groups of three), "0.15", ".5", "1e6", "-3.5", "−3.5"
(U+2212), "+2"; a currency sign before it ("$3.4bn", "-$2", "€5") is skipped; a sign counts only when it does
not follow a letter or digit, so "2021-2024" is 2021 and 2024 and "report-003" is 3. Decimal commas ("3,5") are
not read: that is 3 and 5.

With parse_scale:
- scale words multiply: thousand/k, million/mn/m, billion/bn/b, trillion/tn. Words and two-letter forms may
  follow one space ("1.2 million", "3.4 bn"); single letters must be attached ("12k", "$3.4m"), so "5 m"
  (metres) stays 5 and "5min" stays 5.
- "15%", "15 %", "15 percent", "15 per cent" and "15 pct" are percents.
Without it both are read and ignored: "1.2 million" is 1.2 and "15%" is 15.

Units and currencies are not compared: the check compares values. The percent rule is the reference's:
- a percent reference (15%) accepts 15%, the bare 15 (percent points) and the bare 0.15 (a fraction);
- a plain reference (0.15) reads a percent answer as a fraction: 15% is 0.15, and is not 15.
Tolerances are in the reference's units (percent points for a percent reference): an answer passes when
|answer - reference| <= abs_tolerance + rel_tolerance * |reference|, the edge included.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Context, Decimal, InvalidOperation, localcontext

from workers.definitions.specs import NumericMatch

from .answers import ReferenceMissing, final_answer, last_match, preview, reference_text
from .types import ERROR, Item, Outcome, Sample

NUMBER = re.compile(
    r"""
    (?:(?<![\w.])(?P<sign>[-+\u2212]))?
    [$€£¥]?
    (?<![\w.])
    (?P<digits>(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?|\.\d+)
    (?P<exponent>[eE][-+]?\d{1,3}(?!\d))?
    (?:
        [ \t]?(?P<percent>%|percent\b|per[ \t]?cent\b|pct\b)
      | [ \t]?(?P<word>thousand|million|billion|trillion|bn|mn|tn)\b
      | (?P<letter>[kmb])\b
    )?
    """,
    re.X | re.I,
)
SCALES = {"thousand": 3, "k": 3, "million": 6, "mn": 6, "m": 6, "billion": 9, "bn": 9, "b": 9, "trillion": 12,
          "tn": 12}
# Exact decimal arithmetic (no 1.2 * 1e6 rounding) with room for hostile exponents and digit runs.
EXACT = Context(prec=60, Emax=10**6, Emin=-10**6)


@dataclass(frozen=True)
class Quantity:
    text: str  # as written in the text
    value: Decimal  # the scale applied; a percent keeps its points (15% is 15)
    percent: bool

    def show(self) -> str:
        """For evidence: as written, and the value when that differs ("12.4 million (= 12400000)")."""
        text = self.text if len(self.text) <= 40 else self.text[:39] + "…"
        shown = plain(self.value) + ("%" if self.percent else "")
        return text if text == shown else f"{text} (= {shown})"


def plain(value: Decimal) -> str:
    readable = value == 0 or Decimal("1e-9") <= abs(value) < Decimal("1e15")
    return format(value.normalize(), "f") if readable else format(value, ".6e")


def parse_numbers(text: str, parse_scale: bool = True) -> list[Quantity]:
    return [_quantity(match, parse_scale) for match in NUMBER.finditer(text)]


def parse_number(text: str, parse_scale: bool = True) -> Quantity | None:
    """The first number in `text`, or None."""
    match = NUMBER.search(text)
    return _quantity(match, parse_scale) if match else None


def _quantity(match: re.Match, parse_scale: bool) -> Quantity:
    with localcontext(EXACT):
        value = Decimal(match["digits"].replace(",", ""))
        if match["exponent"]:
            value = value.scaleb(int(match["exponent"][1:]))
        scale = (match["word"] or match["letter"] or "").lower()
        if parse_scale and scale:
            value = value.scaleb(SCALES[scale])
        if match["sign"] in ("-", "\u2212"):
            value = -value
    return Quantity(match.group(0), value, bool(parse_scale and match["percent"]))


def final_number(response: str, parse_scale: bool = True) -> tuple[Quantity | None, str]:
    """The answer's number and where it was read: the first number of a marked final answer (answers.py), else
    the last number of the response."""
    answer = final_answer(response)
    if answer.narrowed:
        return parse_number(answer.text, parse_scale), answer.where
    last = last_match(NUMBER, response)
    return (_quantity(last, parse_scale) if last else None), "the last number of the response"


def difference(answer: Quantity, reference: Quantity) -> Decimal:
    """|answer - reference| in the reference's units, under the percent rule of the module docstring."""
    with localcontext(EXACT):
        if reference.percent and not answer.percent:
            return min(abs(answer.value - reference.value), abs(answer.value.scaleb(2) - reference.value))
        if answer.percent and not reference.percent:
            return abs(answer.value.scaleb(-2) - reference.value)
        return abs(answer.value - reference.value)


def allowed_difference(reference: Quantity, abs_tolerance: float, rel_tolerance: float) -> Decimal:
    with localcontext(EXACT):
        return Decimal(str(abs_tolerance)) + Decimal(str(rel_tolerance)) * abs(reference.value)


def same_number(answer: Quantity, reference: Quantity, abs_tolerance: float = 0, rel_tolerance: float = 1e-9) -> bool:
    try:
        return difference(answer, reference) <= allowed_difference(reference, abs_tolerance, rel_tolerance)
    except (InvalidOperation, ArithmeticError):  # an exponent past even EXACT's range: not a usable number
        return False


def numeric_check(spec: NumericMatch, sample: Sample, item: Item, context) -> Outcome:
    parse_scale = spec.parse_scale
    try:
        reference_source = reference_text(spec.reference, item)
    except ReferenceMissing as exc:
        return Outcome(value=None, status=ERROR, evidence=str(exc))
    reference = parse_number(reference_source, parse_scale)
    if reference is None:
        return Outcome(value=None, status=ERROR, evidence=f"the reference {reference_source!r} (from "
                       f"{spec.reference!r}) holds no number; point it at a numeric field")
    answer, where = final_number(sample.response, parse_scale)
    if answer is None:
        return Outcome.scored(0, f"no number in {where} {preview(sample.response)}; expected {reference.show()}")
    abs_tolerance, rel_tolerance = spec.abs_tolerance, spec.rel_tolerance
    if same_number(answer, reference, abs_tolerance, rel_tolerance):
        return Outcome.scored(1, f"found {answer.show()} in {where}; expected {reference.show()}")
    try:
        gap, allowed = difference(answer, reference), allowed_difference(reference, abs_tolerance, rel_tolerance)
        off = f"off by {plain(gap)}, allowed {plain(allowed)}"
    except ArithmeticError:
        off = "too large to compare"
    return Outcome.scored(0, f"found {answer.show()} in {where}; expected {reference.show()}: {off}")

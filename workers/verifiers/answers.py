"""What the exact checks read: the reference an item's hidden fields fill in, the JSON a response carries, and
the part of a response that holds its final answer.

Where a response carries its final answer, first match wins:
1. a JSON payload (see `json_payload`) that is an object with an "answer" field;
2. the last "Answer: ..." marker ("Final answer:", "**Answer:**", "the answer is" too): the rest of its line,
   or the next non-blank line when the marker ends its line;
3. the last \\boxed{...};
otherwise the answer is the whole response, and `narrowed` is False so callers can pick (numbers take the last
one of a whole response, the first one of a narrowed answer).
"""

from __future__ import annotations

import json
import re
from collections import deque
from dataclasses import dataclass
from typing import Any

from workers.definitions.specs import ScoreModel, VerifierSpec

from .types import Item

FENCED_BLOCK = re.compile(r"```[ \t]*(?:json)?[ \t]*\r?\n(.*?)```", re.S | re.I)
ANSWER_MARKER = re.compile(r"\b(?:final\s+)?answer\b[*_ \t]*(?::|=|\bis\b)[*_ \t]*(?P<rest>[^\r\n]*)", re.I)
BOXED = re.compile(r"\\boxed\s*\{")
MAX_ANSWER_CHARS = 2000  # a final answer is a line, not an essay; bounds what later parsing has to chew


class ReferenceMissing(ValueError):
    """The spec's reference cannot be filled from the item: an authoring fault, not the sample's."""


def reference_text(template: str, item: Item) -> str:
    """A check's `reference` (a format string over the item's hidden fields) filled from the item."""
    try:
        return template.format_map(item.hidden)
    except KeyError as exc:
        raise ReferenceMissing(f"reference {template!r} names hidden field {exc.args[0]!r}, which item "
                               f"{item.key!r} lacks (it has: {', '.join(sorted(item.hidden)) or 'nothing'})")
    except (IndexError, ValueError, AttributeError, TypeError) as exc:
        raise ReferenceMissing(f"reference {template!r} cannot be filled from item {item.key!r}: {exc}")


def references_unfilled(spec: VerifierSpec, item: Item) -> str | None:
    """Why the verifier's checks cannot fill their `reference` from this item's hidden fields, or None: a task
    that lacks what its verifier reads can never be graded (checked when tasks are uploaded)."""
    for layer in spec.layers:
        for check in layer.checks:
            if not hasattr(check, "reference") or (isinstance(check, ScoreModel) and not check.pairwise):
                continue
            try:
                reference_text(check.reference, item)
            except ReferenceMissing as exc:
                return f"{layer.name}/{check.name or check.type}: {exc}"
    return None


def json_payload(response: str) -> tuple[Any, str]:
    """(value, problem): the JSON a response carries, or None and why not.

    Tried in order, once each, so a hostile response costs linear time: the whole response; each fenced block
    (```json or plain ```) until one parses; the span from the first '{' to the last '}'.
    """
    candidates = [response.strip()]
    candidates += [m.group(1).strip() for m in FENCED_BLOCK.finditer(response)]
    first, last = response.find("{"), response.rfind("}")
    if 0 <= first < last:
        candidates.append(response[first:last + 1])
    problem = ""
    for text in candidates:
        if not text:
            continue
        try:
            return json.loads(text), ""
        except RecursionError:
            problem = problem or "the JSON is nested too deeply to read"
        except ValueError as exc:  # JSONDecodeError, and ints past the digit limit
            problem = problem or f"the JSON does not parse: {exc}"
    return None, problem or "the response carries no JSON"


@dataclass(frozen=True)
class FinalAnswer:
    text: str
    source: str  # "json", "marker", "boxed" or "whole" (no marker: `text` is the whole response)

    @property
    def narrowed(self) -> bool:
        return self.source != "whole"

    @property
    def where(self) -> str:
        """For evidence: where the answer was read."""
        return {"json": "the JSON answer field", "marker": "the last 'Answer:' line", "boxed": "the last \\boxed{}",
                "whole": "the response"}[self.source]


def final_answer(response: str) -> FinalAnswer:
    payload, _ = json_payload(response)
    if isinstance(payload, dict) and "answer" in payload and not isinstance(payload["answer"], (dict, list)):
        return FinalAnswer(str(payload["answer"])[:MAX_ANSWER_CHARS], "json")
    marker = last_match(ANSWER_MARKER, response)
    if marker is not None:
        rest = marker.group("rest").strip()
        if not rest:
            following = response[marker.end():].strip()
            rest = following.splitlines()[0] if following else ""
        if rest:
            return FinalAnswer(rest[:MAX_ANSWER_CHARS], "marker")
    boxed = last_match(BOXED, response)
    if boxed is not None:
        return FinalAnswer(_braced(response, boxed.end())[:MAX_ANSWER_CHARS], "boxed")
    return FinalAnswer(response, "whole")


def last_match(pattern: re.Pattern, text: str) -> re.Match | None:
    return next(iter(deque(pattern.finditer(text), maxlen=1)), None)


def _braced(text: str, start: int) -> str:
    """The text from `start` to the brace that closes the one just before it (or to the end)."""
    depth = 1
    for position in range(start, min(len(text), start + MAX_ANSWER_CHARS)):
        depth += {"{": 1, "}": -1}.get(text[position], 0)
        if depth == 0:
            return text[start:position]
    return text[start:start + MAX_ANSWER_CHARS]


def preview(text: str, limit: int = 120) -> str:
    """A response excerpt short enough for evidence, whitespace collapsed."""
    flat = " ".join(text[:limit * 4].split())
    return repr(flat if len(flat) <= limit else flat[:limit - 1] + "…")

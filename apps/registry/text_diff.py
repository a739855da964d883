"""Two versions' specs as YAML, line by line and side by side, for the diff page.

spec_diff (diff.py) says which fields changed; this shows where in the text a reader will find them. Long runs
of unchanged lines fold away, as in a code review, so a one-line change in a long spec stays visible.
"""

from dataclasses import dataclass
from difflib import SequenceMatcher

CONTEXT_LINES = 4


@dataclass(frozen=True)
class DiffRow:
    op: str  # "equal" | "replace" | "delete" | "insert" | "fold"
    old_number: int | None = None
    old_text: str | None = None
    new_number: int | None = None
    new_text: str | None = None
    folded: int = 0  # for "fold": how many unchanged lines it stands for


def side_by_side(old: str, new: str) -> list[DiffRow]:
    """Rows pairing old and new lines; a changed block pads its shorter side so both columns stay aligned."""
    a, b = old.splitlines(), new.splitlines()
    groups = list(SequenceMatcher(None, a, b, autojunk=False).get_grouped_opcodes(CONTEXT_LINES))
    rows: list[DiffRow] = []
    shown_until = 0  # old-side line index after the last group, to count what was folded between groups
    for group in groups:
        start = group[0][1]
        if start > shown_until:
            rows.append(DiffRow("fold", folded=start - shown_until))
        for op, i1, i2, j1, j2 in group:
            for offset in range(max(i2 - i1, j2 - j1)):
                i, j = i1 + offset, j1 + offset
                rows.append(DiffRow(
                    op,
                    old_number=i + 1 if i < i2 else None, old_text=a[i] if i < i2 else None,
                    new_number=j + 1 if j < j2 else None, new_text=b[j] if j < j2 else None,
                ))
        shown_until = group[-1][2]
    if groups and shown_until < len(a):
        rows.append(DiffRow("fold", folded=len(a) - shown_until))
    return rows

"""Structural diff of two specs: what changed, at which field path. Used by the CLI, the API and the pages."""

from dataclasses import dataclass
from typing import Any

from workers.definitions.canonical import canonical_json


@dataclass(frozen=True)
class Change:
    path: str  # "layers[0].checks[1].weight"; "" is the whole spec
    op: str  # "added" | "removed" | "changed"
    old: Any = None
    new: Any = None

    def __str__(self) -> str:
        shown = self.path or "(spec)"
        if self.op == "added":
            return f"+ {shown}: {canonical_json(self.new)}"
        if self.op == "removed":
            return f"- {shown}: {canonical_json(self.old)}"
        return f"~ {shown}: {canonical_json(self.old)} -> {canonical_json(self.new)}"


def spec_diff(old: Any, new: Any, path: str = "") -> list[Change]:
    """Mappings are compared key by key and lists position by position; anything else by value."""
    if isinstance(old, dict) and isinstance(new, dict):
        changes = []
        for key in sorted(set(old) | set(new), key=str):
            child = f"{path}.{key}" if path else str(key)
            if key not in old:
                changes.append(Change(child, "added", new=new[key]))
            elif key not in new:
                changes.append(Change(child, "removed", old=old[key]))
            else:
                changes.extend(spec_diff(old[key], new[key], child))
        return changes
    if isinstance(old, list) and isinstance(new, list):
        changes = []
        for index in range(max(len(old), len(new))):
            child = f"{path}[{index}]"
            if index >= len(old):
                changes.append(Change(child, "added", new=new[index]))
            elif index >= len(new):
                changes.append(Change(child, "removed", old=old[index]))
            else:
                changes.extend(spec_diff(old[index], new[index], child))
        return changes
    if old == new and type(old) is type(new):
        return []
    return [Change(path, "changed", old=old, new=new)]

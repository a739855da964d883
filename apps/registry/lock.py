"""A bundle version's lock: the exact version (and content hash) of every definition its closure pins.

A published bundle stores it as `resolved` (apps/registry/closure.py writes it). Everything that reads what a
bundle pins — the tasks a run samples (pins.py), the run form's estimate, the model a run trains, an eval
suite's key, the run comparison, the registry's dependents — reads this one parse of it: `Version.lock`.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from .refs import LATEST, Ref, parse_ref


@dataclass(frozen=True)
class PinnedVersion:
    """One entry of a lock: an exact version (kind/slug@N) and its content hash."""

    ref: Ref
    content_hash: str

    @property
    def name(self) -> str:
        """kind/slug, the definition it pins a version of."""
        return f"{self.ref.kind}/{self.ref.slug}"


@dataclass(frozen=True)
class BundleLock:
    """What a bundle version pins, in the lock's order (empty for a version of any other kind)."""

    pinned: tuple[PinnedVersion, ...] = ()

    @classmethod
    def parse(cls, resolved: list[dict]) -> BundleLock:
        """From the stored form: [{"ref": "kind/slug@N", "content_hash": ...}, ...]."""
        return cls(tuple(PinnedVersion(parse_ref(entry["ref"]), entry["content_hash"]) for entry in resolved))

    def to_json(self) -> list[dict]:
        """The stored form, as the API shows it."""
        return [{"ref": str(p.ref), "content_hash": p.content_hash} for p in self.pinned]

    @cached_property
    def _by_definition(self) -> dict[tuple[str, str], PinnedVersion]:
        return {(p.ref.kind, p.ref.slug): p for p in self.pinned}

    def get(self, kind: str, slug: str) -> PinnedVersion | None:
        """The version of kind/slug the lock pins, if any."""
        return self._by_definition.get((kind, slug))

    def number(self, kind: str, slug: str) -> int | None:
        pinned = self.get(kind, slug)
        return None if pinned is None else pinned.ref.number

    def of_kind(self, *kinds: str) -> list[PinnedVersion]:
        return [p for p in self.pinned if p.ref.kind in kinds]

    def pin(self, ref: Ref) -> Ref:
        """A floating reference (`slug`, `@latest`) to a definition the lock pins becomes the pinned version;
        explicit numbers and aliases are left as written."""
        pinned = self.get(ref.kind, ref.slug)
        return pinned.ref if pinned is not None and ref.selector in (None, LATEST) else ref

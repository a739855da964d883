"""Parsing references: `kind/slug`, `kind/slug@3`, `kind/slug@prod`, `kind/slug@latest`."""

import re
from dataclasses import dataclass

from workers.definitions.specs import KINDS, SLUG_RE

from .errors import VersionNotFound

_REF = re.compile(rf"^(?P<kind>[a-z_]+)/(?P<slug>{SLUG_RE})(@(?P<selector>[1-9][0-9]*|[a-z][a-z0-9-]*))?$")
LATEST = "latest"


@dataclass(frozen=True)
class Ref:
    kind: str
    slug: str
    selector: str | None = None  # a number, an alias, "latest", or None (= latest)

    @property
    def number(self) -> int | None:
        return int(self.selector) if self.selector and self.selector.isdigit() else None

    def __str__(self) -> str:
        return f"{self.kind}/{self.slug}" + (f"@{self.selector}" if self.selector else "")


def parse_ref(text: str) -> Ref:
    match = _REF.match(text.strip())
    if not match or match["kind"] not in KINDS:
        raise VersionNotFound(
            f"{text!r} is not a reference; write KIND/SLUG[@N|@alias] with KIND one of {', '.join(KINDS)}"
        )
    return Ref(match["kind"], match["slug"], match["selector"])


def split_slug_ref(text: str) -> tuple[str, str | None]:
    """`slug@sel` as written inside specs (the kind is implied by the field) -> (slug, selector)."""
    slug, _, selector = text.partition("@")
    return slug, selector or None

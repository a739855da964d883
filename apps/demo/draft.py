"""What the demo seed publishes: one definition version, as data."""

from dataclasses import dataclass


@dataclass(frozen=True)
class Draft:
    kind: str
    slug: str
    description: str
    spec: dict
    instances: list[dict] | None = None  # task templates only: [{key, inputs, hidden}]

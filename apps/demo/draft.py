"""What the demo seed publishes: one definition version, as data."""

from dataclasses import dataclass

# Publish order: a spec may only name definitions published before it.
PUBLISH_ORDER = ("sandbox_image", "verifier", "task_template", "domain", "bundle")


@dataclass(frozen=True)
class Draft:
    kind: str
    slug: str
    description: str
    spec: dict
    instances: list[dict] | None = None  # task templates only: [{key, inputs, hidden}]

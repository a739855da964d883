"""Eval suites and their comparability keys.

A suite is a bundle version whose spec has `evaluation`. Its comparability key hashes everything a score depends
on besides the model: each pinned definition of the bundle's closure by content hash (templates with their task
instances, sandbox images, verifiers with the judge model they name) and the decoding settings. Scores are shown
side by side only when their keys match; otherwise `key_differences` says what differs, by name.
"""

from __future__ import annotations

import hashlib
import json

from apps.common.errors import StudioError
from apps.registry.models import Version


class NotASuite(StudioError, ValueError):
    """A bundle version asked for as an eval suite that has no `evaluation` settings."""


def suite_settings(version: Version) -> dict:
    """The suite's evaluation settings with their defaults; NotASuite for a bundle without them."""
    if version.definition.kind != "bundle" or not version.spec.get("evaluation"):
        raise NotASuite(f"{version.ref} is not an eval suite: a bundle version with `evaluation` settings")
    return {"samples_per_task": 1, "temperature": 0.0, "tasks_per_template": 0, "seed": 0,
            **version.spec["evaluation"]}


def suite_key(version: Version) -> tuple[str, dict]:
    """(key, the parts it hashes): the pinned closure without the bundle's training model, and the settings."""
    pinned = {p.name: {"version": str(p.ref), "content_hash": p.content_hash}
              for p in version.lock.pinned if p.ref.kind != "model"}
    parts = {"pinned": dict(sorted(pinned.items())), "settings": suite_settings(version)}
    key = hashlib.sha256(json.dumps(parts, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    return key, parts


def key_differences(a: dict, b: dict) -> list[str]:
    """What differs between two suites' key parts, one line each ("verifier/numeric-exact: @1 here, @2 there")."""
    lines = []
    names = sorted(set(a["pinned"]) | set(b["pinned"]))
    for name in names:
        left, right = a["pinned"].get(name), b["pinned"].get(name)
        if left == right:
            continue
        if left is None or right is None:
            lines.append(f"{name}: only in {'the second' if left is None else 'the first'} suite")
        elif left["version"] != right["version"]:
            lines.append(f"{name}: @{left['version'].partition('@')[2]} against @{right['version'].partition('@')[2]}")
        else:
            lines.append(f"{name}: the same version number with different content")
    for setting in sorted(set(a["settings"]) | set(b["settings"])):
        if a["settings"].get(setting) != b["settings"].get(setting):
            lines.append(f"{setting}: {a['settings'].get(setting)!r} against {b['settings'].get(setting)!r}")
    return lines

"""Canonical JSON and content hashes: the identity of a spec, an instance or an instance set."""

import hashlib
import json
from typing import Any


def canonical_json(value: Any) -> str:
    # Sorted keys, no whitespace, UTF-8 kept as is: two equal specs always give the same bytes.
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def content_hash(value: Any) -> str:
    return hashlib.sha256(canonical_json(value).encode()).hexdigest()


def version_content_hash(spec: dict, instance_set_digest: str | None) -> str:
    """A version's identity: its canonical spec, plus the digest of its task instances for task templates."""
    if instance_set_digest is None:
        return content_hash(spec)
    return content_hash({"spec": spec, "instances": instance_set_digest})


def instance_hash(key: str, inputs: dict, hidden: dict) -> str:
    return content_hash({"key": key, "inputs": inputs, "hidden": hidden})


def instance_set_digest(hashes_by_key: dict[str, str]) -> str:
    lines = "".join(f"{key}\t{hashes_by_key[key]}\n" for key in sorted(hashes_by_key))
    return hashlib.sha256(lines.encode()).hexdigest()


def layer_chain_hashes(layers: list[dict]) -> list[str]:
    """Hash of each sandbox-image layer chained to the ones before it: changing layer k changes the hashes of
    layers k, k+1, ... and leaves the cache keys of layers 0..k-1 untouched."""
    hashes, previous = [], ""
    for layer in layers:
        previous = hashlib.sha256((previous + canonical_json(layer)).encode()).hexdigest()
        hashes.append(previous)
    return hashes

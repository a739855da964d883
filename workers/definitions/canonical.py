"""Canonical JSON and content hashes: the identity of a spec, an instance or an instance set."""

import hashlib
import math
from typing import Any

import orjson  # 4x the speed of json.dumps(sort_keys=True) when hashing tens of thousands of task instances


def canonical_bytes(value: Any) -> bytes:
    """Sorted keys, no whitespace, UTF-8: two equal values always give the same bytes.

    NaN and infinities are refused (JSON has no such numbers, and orjson would write them as null).
    """
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS, default=_refuse)
    except orjson.JSONEncodeError as exc:
        raise ValueError(f"not JSON data: {exc}") from None


def _refuse(value: Any):
    raise TypeError(f"{type(value).__name__} is not JSON data")


def canonical_json(value: Any) -> str:
    if has_non_finite(value):
        raise ValueError("not JSON data: NaN and infinities have no JSON form")
    return canonical_bytes(value).decode()


def has_non_finite(value: Any) -> bool:
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, dict):
        return any(has_non_finite(v) for v in value.values())
    if isinstance(value, list | tuple):
        return any(has_non_finite(v) for v in value)
    return False


def content_hash(value: Any) -> str:
    return hashlib.sha256(canonical_bytes(value)).hexdigest()


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

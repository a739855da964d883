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
    problem = data_problem(value)
    if problem:
        raise ValueError(f"not JSON data: {problem}")
    return canonical_bytes(value).decode()


MAX_DEPTH = 64  # no spec or task instance needs more; deeper data breaks every recursive walk after it
INT_RANGE = 2**63  # what canonical hashing (orjson) and PostgreSQL's JSON numbers hold exactly


def data_problem(value: Any, *, where: str = "") -> str | None:
    """Why `value` cannot be a spec's or a task instance's data, or None: nested deeper than MAX_DEPTH, NaN or an
    infinity (JSON has no such numbers), an integer beyond 64 bits, text with a lone surrogate (not Unicode: no
    encoder or database stores it). Iterative, so the check cannot overflow the stack it protects."""
    stack = [(value, 1, where)]
    while stack:
        item, depth, at = stack.pop()
        at_text = (at if len(at) <= 60 else at[:60] + "…") or "the data"
        if depth > MAX_DEPTH:
            return f"{at_text} is nested deeper than {MAX_DEPTH} levels"
        if isinstance(item, float) and not math.isfinite(item):
            return f"{at_text} holds NaN or an infinity, which JSON cannot carry"
        if isinstance(item, int) and not isinstance(item, bool) and not -INT_RANGE <= item < INT_RANGE:
            return f"{at_text} holds an integer beyond 64 bits"
        if isinstance(item, str) and not _is_unicode(item):
            return f"{at_text} holds a lone surrogate (such as \\ud800), which is not Unicode text"
        if isinstance(item, dict):
            for key, child in item.items():
                if isinstance(key, str) and not _is_unicode(key):
                    return f"a key of {at_text} holds a lone surrogate, which is not Unicode text"
                stack.append((child, depth + 1, f"{at}.{key}" if at else str(key)))
        elif isinstance(item, list | tuple):
            stack.extend((child, depth + 1, f"{at}[{index}]") for index, child in enumerate(item))
    return None


def _is_unicode(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


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

"""From a `model` definition (workers/definitions/specs.py ModelSpec) to what a run's config names, and the
content hash of the weights a worker would load, which a run pins.

A run's `model` setting stays the engine's own name for its source (`builtin:...` or a local path); the
definition adds the version a run pins (`model_version`), the weights' hash (`model_sha256`), an optional chat
template and context length. The hash is what makes a pin mean something: a worker whose installed package or
directory holds other weights refuses the run instead of training something else under the same name.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from .packaged import DEMO_MODEL, PACKAGED_MODELS, file_sha256, gguf_file

# The files whose bytes are the weights (safetensors, PyTorch bins, GGUF), shards included; config and tokenizer
# files are not weights: a tokenizer fix keeps the hash.
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")


class WeightsMismatch(RuntimeError):
    """The weights on this worker are not the ones the run pinned."""


def source_model(source: dict) -> str:
    """The run config's `model` for a definition's source."""
    return source["path"] if source["type"] == "local" else f"builtin:{source['name']}"


def directory_weights_sha256(path: Path) -> str:
    """sha256 over a model directory's weight files in name order (each: its name, then its bytes' sha256)."""
    files = sorted(p for p in Path(path).iterdir() if p.is_file() and p.name.endswith(WEIGHT_SUFFIXES))
    if not files:
        raise WeightsMismatch(f"{path} holds no weight files ({', '.join(WEIGHT_SUFFIXES)})")
    digest = hashlib.sha256()
    for file in files:
        digest.update(f"{file.name}\0{file_sha256(file)}\n".encode())
    return digest.hexdigest()


def weights_sha256(model: str) -> str:
    """The hash of the weights `model` loads on this machine; "" for the demo model, whose weights are made
    from the run's own tasks (pinned by the bundle's hash). Raises packaged.ModelUnavailable or OSError when
    the weights are not here."""
    if model == DEMO_MODEL:
        return ""
    if model in PACKAGED_MODELS:
        return file_sha256(gguf_file(PACKAGED_MODELS[model]))
    return directory_weights_sha256(Path(model))


def check_weights(model: str, expected: str) -> None:
    """Raises WeightsMismatch unless `model`'s weights here hash to `expected` (nothing pinned: no check)."""
    if not expected:
        return
    found = weights_sha256(model)
    if found != expected:
        raise WeightsMismatch(f"the weights of {model} on this worker hash to {found[:12]}, but the run pinned "
                              f"{expected[:12]}: install the pinned weights, or start a run on a new model version")

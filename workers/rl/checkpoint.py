"""Checkpoints: a directory per step that appears whole or not at all, in the run's storage (workers/storage: a
local directory, or an S3-compatible bucket every host reads).

    step-000040/
      model.safetensors   the policy's trainable weights (LoRA: the adapters)
      trainer.pt          optimizer, learning-rate schedule, torch / CUDA / Python RNG states
      pipeline.json       the task scheduler and curriculum, draws numbered so far, the buffer of finished but
                          untrained groups, the draws still in flight (rolled out again on resume), counters
      manifest.json       each file's size and sha256, written last: it publishes the checkpoint

The files are staged on this host's disk and published (storage.publish): locally under a `.partial` name,
flushed, then renamed; on an object store uploaded, then the manifest. A worker killed mid-write leaves a
`.partial` directory (or, on an object store, files without a manifest) that the next save removes, never a
checkpoint that looks complete but is not. Any host loads a checkpoint: from the directory itself, or from its
own cached download of it.

Retention: a save keeps the run's newest `keep` checkpoints. One worth more (aliased, or queued for an
evaluation) has been copied out of the run's directory by the studio first (apps/runs/checkpoints.py).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch

from workers.storage import Storage

STEP_DIR = "step-{:06d}"
FILES = ("model.safetensors", "trainer.pt", "pipeline.json")


@dataclass
class Checkpoint:
    step: int
    path: str  # its local directory, or its folder's URL in the object store
    size: int
    location: Storage = field(repr=False, compare=False)  # the storage rooted at its folder


def checkpoint_storage(root: Path | str | Storage) -> Storage:
    """A run's checkpoint directory: a Storage, or a local directory (or URL) to make one of."""
    return root if isinstance(root, Storage) else Storage(root)


def save_checkpoint(root: Path | str | Storage, *, step: int, policy, trainer_state: dict, pipeline_state: dict,
                    keep: int) -> tuple[Checkpoint, list[int]]:
    """Write step `step`; keep the newest `keep`. Returns the checkpoint and the steps removed."""
    store = checkpoint_storage(root)
    _remove_unfinished(store)
    key = STEP_DIR.format(step)
    staging = store.stage(key)
    policy.save(staging / "model.safetensors")
    # Through a Python file: a full disk then raises OSError (ENOSPC), which torch's own file writer reports only as
    # "unexpected pos" — the run's error must say the disk is full.
    with open(staging / "trainer.pt", "wb") as handle:
        torch.save(trainer_state, handle)
    (staging / "pipeline.json").write_text(json.dumps(pipeline_state))
    manifest = store.publish(key, staging, step=step)
    removed = []
    for old in checkpoints(store)[:-keep]:
        store.unpublish(STEP_DIR.format(old.step))
        removed.append(old.step)
    size = sum(entry["bytes"] for entry in manifest["files"].values())
    return Checkpoint(step, store.url_of(key), size, store.child(key)), removed


def _remove_unfinished(store: Storage) -> None:
    """What a writer killed mid-save left: a `.partial` directory, or an object store's files without a manifest."""
    for name in store.names():
        if name.endswith(".partial") or (not store.local and name.startswith("step-") and not store.published(name)):
            store.remove(name)


def checkpoints(root: Path | str | Storage) -> list[Checkpoint]:
    """The complete checkpoints, oldest first."""
    store = checkpoint_storage(root)
    found = []
    for name in store.names():
        if not name.startswith("step-") or name.endswith(".partial"):
            continue
        try:
            step = int(name.removeprefix("step-"))
        except ValueError:
            continue
        manifest = store.manifest(name)
        if manifest is not None:
            size = sum(entry["bytes"] for entry in manifest["files"].values())
        elif store.local:  # a local checkpoint written before manifests: its rename made it whole
            directory = Path(store.url_of(name))
            if not all((directory / file).is_file() for file in FILES):
                continue
            size = sum(os.path.getsize(directory / file) for file in FILES)
        else:
            continue
        found.append(Checkpoint(step, store.url_of(name), size, store.child(name)))
    return sorted(found, key=lambda c: c.step)


def latest_checkpoint(root: Path | str | Storage) -> Checkpoint | None:
    found = checkpoints(root)
    return found[-1] if found else None


def load_checkpoint(checkpoint: Checkpoint, *, policy, device: str = "cpu") -> tuple[dict, dict]:
    """Restores the policy's weights; returns (trainer state, pipeline state) for the caller to restore."""
    directory = checkpoint.location.fetch()
    policy.restore(directory / "model.safetensors")
    trainer_state = torch.load(directory / "trainer.pt", map_location=device, weights_only=True)
    pipeline_state = json.loads((directory / "pipeline.json").read_text())
    return trainer_state, pipeline_state

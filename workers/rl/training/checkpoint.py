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

Fencing by attempt, in the storage alone (a host that lost the run's lease may still reach the bucket, not the
database): each attempt, as it restores and before it writes anything, records `attempts/<n>.json` with the step it
resumed from; each checkpoint's manifest names the attempt that wrote it (none: written before fencing, attempt 0).
A checkpoint of attempt a at step s is valid only while no later attempt resumed from a step before s — what an
older attempt published after a newer one took the run over is ignored, never resumed from, and removed by the
next save. A writer that finds a newer attempt's record refuses to publish or remove anything (LeaseLost).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch

from workers.storage import Storage

from ..protocols import LeaseLost, Policy

STEP_DIR = "step-{:06d}"
FILES = ("model.safetensors", "trainer.pt", "pipeline.json")
ATTEMPTS = "attempts"  # attempts/<n>.json: the step attempt n resumed from


@dataclass
class Checkpoint:
    step: int
    path: str  # its local directory, or its folder's URL in the object store
    size: int
    location: Storage = field(repr=False, compare=False)  # the storage rooted at its folder
    attempt: int = 0  # the run's attempt that wrote it (0: written before checkpoints named theirs)


def checkpoint_storage(root: Path | str | Storage) -> Storage:
    """A run's checkpoint directory: a Storage, or a local directory (or URL) to make one of."""
    return root if isinstance(root, Storage) else Storage(root)


def save_checkpoint(root: Path | str | Storage, *, step: int, policy: Policy, trainer_state: dict, pipeline_state: dict,
                    keep: int, attempt: int = 1) -> tuple[Checkpoint, list[int]]:
    """Write step `step` as attempt `attempt` of the run; keep the newest `keep`. Returns the checkpoint and the
    steps removed. LeaseLost, with nothing published or removed, if a newer attempt has resumed the run."""
    store = checkpoint_storage(root)
    _refuse_if_superseded(store, attempt, _resumed(store))
    _remove_unfinished(store)
    key = STEP_DIR.format(step)
    staging = store.stage(key)
    policy.save(staging / "model.safetensors")
    # Through a Python file: a full disk then raises OSError (ENOSPC), which torch's own file writer reports only as
    # "unexpected pos" — the run's error must say the disk is full.
    with open(staging / "trainer.pt", "wb") as handle:
        torch.save(trainer_state, handle)
    (staging / "pipeline.json").write_text(json.dumps(pipeline_state))
    _refuse_if_superseded(store, attempt, _resumed(store))  # again: staging a large model takes a while
    manifest = store.publish(key, staging, step=step, attempt=attempt)
    resumed = _resumed(store)
    _refuse_if_superseded(store, attempt, resumed)
    found = _published(store)
    valid = [c for c in found if _valid(c, resumed)]
    removed = []
    # The newest `keep` valid ones stay; what an older attempt published after it lost the run goes as well.
    for old in valid[:-keep] + [c for c in found if not _valid(c, resumed)]:
        if old.attempt <= attempt and old.step != step:
            store.unpublish(STEP_DIR.format(old.step))
            removed.append(old.step)
    size = sum(entry["bytes"] for entry in manifest["files"].values())
    return Checkpoint(step, store.url_of(key), size, store.child(key), attempt), sorted(removed)


def resume_checkpoint(root: Path | str | Storage, *, attempt: int) -> Checkpoint | None:
    """The newest valid checkpoint, for attempt `attempt` to resume from (None: it starts from scratch), once the
    storage records that this attempt resumed there (`attempts/<n>.json`): from then on what an older attempt
    publishes after that step is not a checkpoint. Called before the attempt writes anything. LeaseLost if a
    newer attempt has resumed the run already."""
    store = checkpoint_storage(root)
    resumed = _resumed(store)
    _refuse_if_superseded(store, attempt, resumed)
    valid = [c for c in _published(store) if _valid(c, resumed)]
    latest = valid[-1] if valid else None
    step = latest.step if latest is not None else 0
    # The same attempt restoring twice keeps the earlier step: it never makes valid what was not.
    step = min(step, resumed.get(attempt, step))
    store.write(f"{ATTEMPTS}/{attempt}.json", json.dumps({"attempt": attempt, "resumed_from": step}).encode())
    return latest


def _resumed(store: Storage) -> dict[int, int]:
    """{attempt: the step it resumed from (0: from scratch)}, as the attempts recorded it."""
    found = {}
    for name in store.names(ATTEMPTS):
        number = name.removesuffix(".json")
        if not name.endswith(".json") or not number.isdigit():
            continue  # a local write's temporary file
        try:
            found[int(number)] = int(json.loads(store.read(f"{ATTEMPTS}/{name}"))["resumed_from"])
        except FileNotFoundError:
            continue
    return found


def _valid(checkpoint: Checkpoint, resumed: dict[int, int]) -> bool:
    """Whether no attempt after the one that wrote `checkpoint` resumed from a step before it."""
    return all(step >= checkpoint.step for later, step in resumed.items() if later > checkpoint.attempt)


def _refuse_if_superseded(store: Storage, attempt: int, resumed: dict[int, int]) -> None:
    newest = max(resumed, default=0)
    if newest > attempt:
        raise LeaseLost(f"attempt {newest} of this run resumed it from step {resumed[newest]} ({store}): attempt "
                        f"{attempt} no longer owns it and writes no checkpoint there")


def _remove_unfinished(store: Storage) -> None:
    """What a writer killed mid-save left: a `.partial` directory, or an object store's files without a manifest."""
    for name in store.names():
        if name.endswith(".partial") or (not store.local and name.startswith("step-") and not store.published(name)):
            store.remove(name)


def checkpoints(root: Path | str | Storage) -> list[Checkpoint]:
    """The complete, valid checkpoints, oldest first."""
    store = checkpoint_storage(root)
    resumed = _resumed(store)
    return [c for c in _published(store) if _valid(c, resumed)]


def _published(store: Storage) -> list[Checkpoint]:
    """The complete checkpoints, valid or not, oldest first."""
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
        attempt = int((manifest or {}).get("attempt", 0))
        found.append(Checkpoint(step, store.url_of(name), size, store.child(name), attempt))
    return sorted(found, key=lambda c: c.step)


def latest_checkpoint(root: Path | str | Storage) -> Checkpoint | None:
    found = checkpoints(root)
    return found[-1] if found else None


def load_checkpoint(checkpoint: Checkpoint, *, policy: Policy, device: str = "cpu") -> tuple[dict, dict]:
    """Restores the policy's weights; returns (trainer state, pipeline state) for the caller to restore."""
    with checkpoint.location.fetched() as directory:  # this host's cached copy stays until it is read
        policy.restore(directory / "model.safetensors")
        trainer_state = torch.load(directory / "trainer.pt", map_location=device, weights_only=True)
        pipeline_state = json.loads((directory / "pipeline.json").read_text())
    return trainer_state, pipeline_state

"""Checkpoints: a directory per step that appears whole or not at all.

    step-000040/
      model.safetensors   the policy's trainable weights (LoRA: the adapters)
      trainer.pt          optimizer, learning-rate schedule, torch / CUDA / Python RNG states
      pipeline.json       the task scheduler and curriculum, draws numbered so far, the buffer of finished but
                          untrained groups, the draws still in flight (rolled out again on resume), counters

It is written under a temporary name, flushed to disk, then renamed: a worker killed mid-write leaves a
`.partial` directory that the next save removes, never a checkpoint that looks complete but is not.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch

STEP_DIR = "step-{:06d}"


@dataclass
class Checkpoint:
    step: int
    path: Path
    size: int


def _fsync_directory(path: Path) -> None:
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _fsync_files(path: Path) -> None:
    """Every file of `path` and the directory entry itself on disk (a rename is only as durable as this)."""
    for file in path.iterdir():
        if file.is_file():
            with file.open("rb") as handle:
                os.fsync(handle.fileno())
    _fsync_directory(path)


def save_checkpoint(root: Path, *, step: int, policy, trainer_state: dict, pipeline_state: dict,
                    keep: int) -> tuple[Checkpoint, list[int]]:
    """Write step `step`; keep the newest `keep`. Returns the checkpoint and the steps removed."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    for leftover in root.glob("*.partial"):
        shutil.rmtree(leftover, ignore_errors=True)
    final = root / STEP_DIR.format(step)
    partial = root / (final.name + ".partial")
    partial.mkdir()
    policy.save(partial / "model.safetensors")
    torch.save(trainer_state, partial / "trainer.pt")
    (partial / "pipeline.json").write_text(json.dumps(pipeline_state))
    _fsync_files(partial)
    if final.exists():  # the same step written again by a resumed attempt
        shutil.rmtree(final)
    partial.rename(final)
    _fsync_directory(root)
    removed = []
    for old in sorted(checkpoints(root), key=lambda c: c.step)[:-keep]:
        shutil.rmtree(old.path, ignore_errors=True)
        removed.append(old.step)
    size = sum(f.stat().st_size for f in final.iterdir())
    return Checkpoint(step, final, size), removed


def checkpoints(root: Path) -> list[Checkpoint]:
    root = Path(root)
    if not root.is_dir():
        return []
    found = []
    for path in root.iterdir():
        if path.is_dir() and path.name.startswith("step-") and not path.name.endswith(".partial"):
            try:
                step = int(path.name.removeprefix("step-"))
            except ValueError:
                continue
            if all((path / name).is_file() for name in ("model.safetensors", "trainer.pt", "pipeline.json")):
                found.append(Checkpoint(step, path, sum(f.stat().st_size for f in path.iterdir())))
    return sorted(found, key=lambda c: c.step)


def latest_checkpoint(root: Path) -> Checkpoint | None:
    found = checkpoints(root)
    return found[-1] if found else None


def load_checkpoint(checkpoint: Checkpoint, *, policy, device: str = "cpu") -> tuple[dict, dict]:
    """Restores the policy's weights; returns (trainer state, pipeline state) for the caller to restore."""
    policy.restore(checkpoint.path / "model.safetensors")
    trainer_state = torch.load(checkpoint.path / "trainer.pt", map_location=device, weights_only=True)
    pipeline_state = json.loads((checkpoint.path / "pipeline.json").read_text())
    return trainer_state, pipeline_state

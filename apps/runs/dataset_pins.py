"""What an SFT or DPO run trains on, pinned when the run is created: the file it reads and that file's sha256.

A dataset is named as a dataset version (`dataset/SLUG@N`, a registry definition built by apps/datasets), which
resolves to the file the studio writes for it (apps/registry/dataset_store.py), from anywhere; or as a JSONL file's
path — from the command line only: a path typed into a page or the API would let its author read any file of
the studio's host. Either way the run's config records the file and its hash (SFTConfig.dataset_file,
dataset_sha256), and the file is read and checked row by row now, so a broken line is refused before a worker
is asked to train on it. A worker on another host writes a dataset version's file again where it is
(`dataset_here`), from the rows the version pins.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from apps.accounts.models import Project
from apps.common.errors import StudioError
from apps.registry.dataset_store import dataset_materialise
from apps.registry.errors import VersionNotFound
from workers.rl.config import SFTConfig
from workers.rl.training.data_files import DataFileError, file_sha256, read_dataset

FORMAT_OF_KIND = {"sft": "sft", "dpo": "preference"}  # a run kind -> the dataset format it trains on


class DatasetRefused(StudioError, ValueError):
    """The dataset cannot be trained on, in words for whoever named it; its field is the run's `dataset`."""

    def __init__(self, message: str):
        super().__init__(message, field="dataset")


def dataset_pin(*, project: Project, dataset: str, kind: str, via: str) -> dict:
    """The settings an SFT or DPO run pins for `dataset`: {dataset (a version's exact ref), dataset_file,
    dataset_sha256}. DatasetRefused with the reason (no such file, not from the command line, a line that breaks
    the row contract)."""
    if not dataset:
        raise DatasetRefused(f"a {kind} run trains on a dataset: name a JSONL file (train --dataset PATH)")
    if dataset.startswith("dataset/"):
        try:
            version = dataset_materialise(project=project, text=dataset)
        except VersionNotFound as exc:
            raise DatasetRefused(str(exc)) from None
        if version.format != FORMAT_OF_KIND[kind]:
            raise DatasetRefused(f"{version.ref} holds {version.format} rows; a {kind} run trains on "
                                 f"{FORMAT_OF_KIND[kind]} rows")
        path, sha256, dataset = version.path, version.sha256, version.ref  # its exact version, pinned
    elif via != "cli":
        raise DatasetRefused("a dataset file's path is taken from the command line only (train --dataset PATH): "
                             "from a page or the API it would read any file of the studio's host")
    else:
        path = Path(dataset).expanduser().resolve()
        if not path.is_file():
            raise DatasetRefused(f"dataset {dataset}: no such file")
        sha256 = file_sha256(path)
    try:
        read_dataset(path, kind, sha256=sha256)
    except DataFileError as exc:
        raise DatasetRefused(str(exc)) from None
    return {"dataset": dataset, "dataset_file": str(path), "dataset_sha256": sha256}


def dataset_here(*, project: Project, config: SFTConfig) -> SFTConfig:
    """The config with `dataset_file` where this host keeps the dataset version the run pinned (written from the
    rows the version pins if it is not here yet); a file path named on the command line stays as it is."""
    if not config.dataset.startswith("dataset/"):
        return config
    version = dataset_materialise(project=project, text=config.dataset)
    if version.sha256 != config.dataset_sha256:
        raise DatasetRefused(f"{config.dataset} now names rows of hash {version.sha256[:12]}…, not the "
                             f"{config.dataset_sha256[:12]}… this run pinned (an alias moved?)")
    return dataclasses.replace(config, dataset_file=str(version.path))

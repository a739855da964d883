"""What an SFT or DPO run trains on, pinned when the run is created: the file it reads and that file's sha256.

A dataset is named as a JSONL file's path — from the command line only: a path typed into a page or the API
would let its author read any file of the studio's host — and will be named as a dataset version
(`dataset/SLUG@N`) once datasets are registry definitions (issue 28b), which resolves to the file the studio
writes for it. Either way the run's config records the file and its hash (RunConfig.dataset_file,
dataset_sha256), and the file is read and checked row by row now, so a broken line is refused before a worker
is asked to train on it.
"""

from __future__ import annotations

from pathlib import Path

from apps.accounts.models import Project
from workers.rl.training.datasets import DatasetError, file_sha256, read_dataset


class DatasetRefused(ValueError):
    """The dataset cannot be trained on, in words for whoever named it."""


def dataset_pin(*, project: Project, dataset: str, kind: str, via: str) -> dict:
    """The settings an SFT or DPO run pins for `dataset`: {dataset_file, dataset_sha256}. DatasetRefused with the
    reason (no such file, not from the command line, a line that breaks the row contract)."""
    if not dataset:
        raise DatasetRefused(f"a {kind} run trains on a dataset: name a JSONL file (train --dataset PATH)")
    if dataset.startswith("dataset/"):
        raise DatasetRefused(f"{dataset}: dataset versions are not in the registry yet; name the JSONL file's "
                             "path on the command line (train --dataset PATH)")
    if via != "cli":
        raise DatasetRefused("a dataset file's path is taken from the command line only (train --dataset PATH): "
                             "from a page or the API it would read any file of the studio's host")
    path = Path(dataset).expanduser().resolve()
    if not path.is_file():
        raise DatasetRefused(f"dataset {dataset}: no such file")
    sha256 = file_sha256(path)
    try:
        read_dataset(path, kind, sha256=sha256)
    except DatasetError as exc:
        raise DatasetRefused(str(exc)) from None
    return {"dataset_file": str(path), "dataset_sha256": sha256}

"""Where a dataset version's rows live, and a version as a JSONL file a trainer reads.

A dataset version (kind `dataset`, workers/definitions/specs.py DatasetSpec) pins the sha256 of its rows, one JSON
object a line: the rows themselves are a blob of the blob storage named by that hash (`datasets/<sha256>.jsonl`),
written once by the build that made them (apps/datasets) and never changed, so every host that trains on
`dataset/<slug>@N` reads the same bytes. An uploaded file is stored the same way (`datasets/uploads/<sha256>.jsonl`)
before a build reads it.

`dataset_materialise(project=, text="dataset/<slug>@N")` is the door a training run takes (`train --dataset`,
apps/runs): the version's rows as a local file, checked against the hash the version pins.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings

from apps.accounts.models import Project
from apps.common import wiring

from .errors import FieldError, SpecError, VersionNotFound
from .models import Version
from .refs import Ref, parse_ref, split_slug_ref
from .selectors import version_resolve

ROWS = "datasets"
UPLOADS = "datasets/uploads"


class DatasetUnavailable(VersionNotFound):
    """The rows a dataset version pins are missing or no longer hash to what it pins."""


def rows_key(sha256: str) -> str:
    return f"{ROWS}/{sha256}.jsonl"


def upload_key(sha256: str) -> str:
    return f"{UPLOADS}/{sha256}.jsonl"


def jsonl_store(content: bytes, *, key_of=rows_key) -> str:
    """Store `content` (JSONL) under its sha256 (once: the same bytes are the same blob); returns the hash."""
    digest = hashlib.sha256(content).hexdigest()
    storage = wiring.blob_storage()
    if not storage.exists(key_of(digest)):
        storage.write(key_of(digest), content)
    return digest


def jsonl_read(sha256: str, *, key_of=rows_key) -> bytes:
    """The stored JSONL of that hash, checked: DatasetUnavailable if it is gone or hashes otherwise."""
    try:
        content = wiring.blob_storage().read(key_of(sha256))
    except FileNotFoundError:
        raise DatasetUnavailable(f"the rows of hash {sha256[:12]}… are not in the blob storage "
                                 f"({key_of(sha256)}); build the dataset again") from None
    if hashlib.sha256(content).hexdigest() != sha256:
        raise DatasetUnavailable(f"the stored rows {key_of(sha256)} no longer hash to {sha256[:12]}…: the blob "
                                 "storage was changed behind the studio's back; build the dataset again")
    return content


def dataset_spec_check(spec: dict) -> None:
    """What publishing a dataset version checks beyond its schema: the rows it pins are stored, hash to what it
    says and number what it says, and every upload it names is stored (SpecError naming the field)."""
    errors = []
    try:
        content = jsonl_read(spec["content_sha256"])
    except DatasetUnavailable as exc:
        errors.append(FieldError("content_sha256", f"{exc} (a dataset version is published by building it: the "
                                                   "datasets page, or manage.py dataset_build)"))
    else:
        lines = content.count(b"\n")
        if lines != spec["rows"]:
            errors.append(FieldError("rows", f"the stored rows number {lines}, not {spec['rows']}"))
    storage = wiring.blob_storage()
    for position, source in enumerate(spec["sources"]):
        if source["type"] == "upload" and not storage.exists(upload_key(source["sha256"])):
            errors.append(FieldError(f"sources[{position}].sha256", "no upload with this hash is stored; upload "
                                                                    "the file on the datasets page first"))
    if errors:
        raise SpecError(errors)


@dataclass(frozen=True)
class DatasetFile:
    """A dataset version's rows on this host's disk, as a trainer reads them."""

    ref: str  # dataset/<slug>@N
    path: Path
    sha256: str
    rows: int
    format: str  # sft | preference


def dataset_file(version: Version) -> DatasetFile:
    """The version's rows as a local JSONL file (written once per hash under the data directory's cache, checked
    against the hash the version pins)."""
    if version.definition.kind != "dataset":
        raise VersionNotFound(f"{version.ref} is not a dataset")
    spec = version.spec
    path = Path(settings.DATA_DIR) / "cache" / ROWS / f"{spec['content_sha256']}.jsonl"
    if not path.is_file():
        content = jsonl_read(spec["content_sha256"])
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f"{path.name}.partial")
        partial.write_bytes(content)
        partial.replace(path)  # whole or not at all
    return DatasetFile(ref=version.ref, path=path, sha256=spec["content_sha256"], rows=spec["rows"],
                       format=spec["format"])


def dataset_ref(text: str) -> Ref:
    """`dataset/<slug>@N`, `dataset/<slug>` (the newest) or `<slug>@N`, as `--dataset` takes it."""
    text = text.strip()
    ref = parse_ref(text) if "/" in text else Ref("dataset", *split_slug_ref(text))
    if ref.kind != "dataset":
        raise VersionNotFound(f"{text!r} names a {ref.kind}, not a dataset; write dataset/<slug>@<version>")
    return ref


def dataset_materialise(*, project: Project, text: str) -> DatasetFile:
    """The dataset version `text` names (dataset_ref) in `project`, as a local file: what `train --dataset
    dataset/<slug>@N` trains on. VersionNotFound (or DatasetUnavailable) says what is wrong."""
    return dataset_file(version_resolve(project=project, ref=dataset_ref(text)))

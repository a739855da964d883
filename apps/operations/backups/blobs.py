"""The blob storage's half of a backup: every object under the studio's prefixes (checkpoints, kept checkpoints,
trajectory artifacts, base models) copied into the backup with its size and sha256 (and, from an object store, the
ETag it reported: the listing), and copied back into an empty storage, published directories' manifests last.

Objects are copied, not only listed, on an object store too: a listing is worth something only while the bucket
still holds those versions, and a restore into another bucket (or after the objects were lost) needs the bytes.

Left out: `weights/` (the weights a run publishes for its inference servers; published again when it resumes) and
whatever a writer left half done (`*.partial`, `*.tmp-*`, `*.evicted-*`, lock files).
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from workers.storage import MANIFEST, Storage

from .errors import BackupError

PREFIXES = ("checkpoints", "artifacts", "models")
THREADS = 8  # an object store answers many requests at once; a local disk does not mind


def _half_written(key: str) -> bool:
    return any(part.startswith(".") or ".partial" in part or ".tmp-" in part or ".evicted-" in part
               for part in key.split("/"))


def listing(storage: Storage, *, prefixes=PREFIXES) -> dict[str, dict]:
    """The objects a backup holds, as the storage lists them now: key -> {"bytes", "etag"?}."""
    found = {}
    for prefix in prefixes:
        found.update({key: entry for key, entry in storage.listing(prefix).items() if not _half_written(key)})
    return dict(sorted(found.items()))


def _hashes(path: Path) -> dict[str, str]:
    sha256, md5 = hashlib.sha256(), hashlib.md5(usedforsecurity=False)
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            sha256.update(block)
            md5.update(block)
    return {"sha256": sha256.hexdigest(), "md5": md5.hexdigest()}


class Progress:
    """Says how far a copy has got, at most every `every` seconds."""

    def __init__(self, say: Callable[[str], None], what: str, total: int, total_bytes: int, every: float = 2.0):
        self.say, self.what, self.total, self.total_bytes, self.every = say, what, total, total_bytes, every
        self.done = self.bytes = 0
        self.last = time.monotonic()

    def advance(self, size: int) -> None:
        self.done, self.bytes = self.done + 1, self.bytes + size
        if time.monotonic() - self.last >= self.every or self.done == self.total:
            self.last = time.monotonic()
            self.say(f"{self.what}: {self.done}/{self.total} objects, "
                     f"{self.bytes / 1e6:.1f}/{self.total_bytes / 1e6:.1f} MB")


def _published_directories(entries: dict[str, dict]) -> dict[str, set[str]]:
    """Each published directory among the keys (one holding a manifest) -> the keys of its files."""
    directories = {key.rsplit("/", 1)[0] for key in entries if key.endswith(f"/{MANIFEST}")}
    return {directory: {key for key in entries if key.startswith(f"{directory}/")} for directory in directories}


def back_up(storage: Storage, into: Path, *, prefixes=PREFIXES, say: Callable[[str], None]) -> dict[str, dict]:
    """Copy every object under `prefixes` into `into`/KEY; returns key -> {"bytes", "sha256", "md5", "etag"?}.
    A published directory whose files do not match its manifest (published again while it was copied) is copied
    again; one removed meanwhile (retention) is left out whole, as the database will not name it for long."""
    entries = listing(storage, prefixes=prefixes)
    progress = Progress(say, "blobs", len(entries), sum(e["bytes"] for e in entries.values()))
    copied: dict[str, dict] = {}

    def copy(key: str) -> None:
        target = into / key
        try:
            storage.download(key, target)
        except FileNotFoundError:  # removed since the listing
            target.unlink(missing_ok=True)
            progress.advance(0)
            return
        copied[key] = {**entries[key], "bytes": target.stat().st_size, **_hashes(target)}
        progress.advance(copied[key]["bytes"])

    with ThreadPoolExecutor(THREADS) as pool:
        list(pool.map(copy, entries))
    for directory, keys in _published_directories(entries).items():
        for attempt in range(3):
            if _matches_manifest(into, directory, copied):
                break
            if attempt == 2 or not storage.published(directory):
                say(f"blobs: {directory} changed or went away while it was copied; it is left out")
                for key in keys:
                    copied.pop(key, None)
                    (into / key).unlink(missing_ok=True)
                break
            fresh = {key: entry for key, entry in storage.listing(directory).items() if not _half_written(key)}
            for key in keys - fresh.keys():
                copied.pop(key, None)
                (into / key).unlink(missing_ok=True)
            entries.update(fresh)
            keys = set(fresh)
            for key in fresh:
                copy(key)
    return dict(sorted(copied.items()))


def _matches_manifest(into: Path, directory: str, copied: dict[str, dict]) -> bool:
    key = f"{directory}/{MANIFEST}"
    if key not in copied:
        return False
    files = json.loads((into / key).read_text()).get("files", {})
    return all(copied.get(f"{directory}/{name}", {}).get("sha256") == expected.get("sha256")
               for name, expected in files.items())


def check_copies(into: Path, blobs: dict[str, dict], *, say: Callable[[str], None]) -> None:
    """Every object of the backup is there with the size and sha256 the manifest says (BackupError naming the
    first ones that are not)."""
    progress = Progress(say, "checking the backup's blobs", len(blobs), sum(e["bytes"] for e in blobs.values()))
    wrong = []
    for key, expected in blobs.items():
        path = into / key
        if not path.is_file():
            wrong.append(f"{key} is missing")
        elif path.stat().st_size != expected["bytes"] or _hashes(path)["sha256"] != expected["sha256"]:
            wrong.append(f"{key} is not the file that was backed up")
        progress.advance(expected["bytes"])
    if wrong:
        raise BackupError(f"the backup is damaged, nothing was restored: {'; '.join(wrong[:5])}"
                          + (f" (and {len(wrong) - 5} more)" if len(wrong) > 5 else ""))


def restore(storage: Storage, source: Path, blobs: dict[str, dict], *, say: Callable[[str], None]) -> list[str]:
    """Copy the backup's objects into `storage`: each published directory's files before its manifest, so that no
    reader sees a directory before all of it is there. Returns the keys written; on failure, removes them and
    raises (the storage is as empty as it was)."""
    written: list[str] = []
    files = [key for key in blobs if not key.endswith(f"/{MANIFEST}")]
    manifests = [key for key in blobs if key.endswith(f"/{MANIFEST}")]
    progress = Progress(say, "blobs", len(blobs), sum(e["bytes"] for e in blobs.values()))

    def put(key: str) -> None:
        storage.upload(key, source / key)
        written.append(key)
        progress.advance(blobs[key]["bytes"])

    try:
        with ThreadPoolExecutor(THREADS) as pool:
            list(pool.map(put, files))
            list(pool.map(put, manifests))
    except BaseException:
        remove(storage, written, say=say)
        raise
    return written


def remove(storage: Storage, keys: list[str], *, say: Callable[[str], None]) -> None:
    """Take back what a failed restore wrote, manifests first."""
    say(f"blobs: removing the {len(keys)} objects this restore wrote")
    for key in sorted(keys, key=lambda k: not k.endswith(f"/{MANIFEST}")):
        storage.remove(key)


def verify(storage: Storage, blobs: dict[str, dict], *, prefixes=PREFIXES) -> list[str]:
    """What differs between the storage's objects under `prefixes` and the backup's: [] when every object is there
    with its size (and, from an object store that reports an MD5 ETag for a single-part upload, that MD5)."""
    found = listing(storage, prefixes=prefixes)
    problems = [f"{key} is missing" for key in blobs.keys() - found.keys()]
    problems += [f"{key} is not in the backup" for key in found.keys() - blobs.keys()]
    for key in blobs.keys() & found.keys():
        expected, there = blobs[key], found[key]
        etag = there.get("etag", "")
        if there["bytes"] != expected["bytes"]:
            problems.append(f"{key} has {there['bytes']} bytes, not {expected['bytes']}")
        elif etag and "-" not in etag and etag != expected["md5"]:
            problems.append(f"{key}'s ETag {etag} is not the MD5 of the file backed up")
    return sorted(problems)

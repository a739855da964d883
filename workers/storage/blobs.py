"""Blobs — checkpoints, trajectory artifacts, converted models, exports — under one root, through fsspec: a local
directory (the embedded default, STUDIO_DATA_DIR) or an S3-compatible bucket (`s3://bucket/prefix`, s3fs), so
that any host reads what another one wrote.

A key is a relative, slash-separated path under the root. A single blob is written whole: a local file by a
rename, an object by one PUT (atomic in S3).

A *published directory* is several blobs that appear together (a checkpoint's weights, optimizer and pipeline
state; a converted model). Its files are written first and its `manifest.json` (each file's size and sha256)
last; for readers a directory does not exist until it is published. Locally the files are staged in
`KEY.partial` beside it, flushed, and renamed into place, as the studio always did. An object store has no
rename: there the manifest is the publication, a new version first takes the old manifest away, and a reader
checks every file it downloads against the manifest it read.

An object store's directories are read through a cache on this host's disk (`cache`, under STUDIO_DATA_DIR):
`fetch` downloads a published directory there once, and the host that publishes one keeps its staged copy there.
The cache holds at most `cache_bytes` (STUDIO_STORAGE_CACHE_BYTES, 20 GB): after each fetch and publish the least
recently used directories are evicted whole, except one a process of this host holds right now (`fetched`: a
shared flock on its manifest, which eviction must take exclusively).

An object store that does not answer (a refused or reset connection, a timeout, an HTTP 5xx or SlowDown) is waited
for, each call tried again with backoff for up to `outage_seconds` (STUDIO_STORAGE_OUTAGE_SECONDS, 120), as a run
waits for its database; an answer that will not change (403, no such bucket, a full local disk) is raised at once.

Credentials and the endpoint of an S3-compatible server are the AWS SDK's own variables (AWS_ACCESS_KEY_ID,
AWS_SECRET_ACCESS_KEY, AWS_ENDPOINT_URL_S3, AWS_DEFAULT_REGION), read where the work runs: the studio stores none.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import fsspec
from fsspec.implementations.local import LocalFileSystem

MANIFEST = "manifest.json"
CACHE_BYTES = 20 * 10**9  # STUDIO_STORAGE_CACHE_BYTES unset
OUTAGE_SECONDS = 120.0  # STUDIO_STORAGE_OUTAGE_SECONDS unset: as long as a run waits for its database

log = logging.getLogger(__name__)


class StorageChanged(OSError):
    """A published directory was replaced while it was being downloaded; reading it again gets the new one."""


class StorageUnavailable(OSError):
    """The object store did not answer for the whole outage bound (`Storage.outage_seconds`)."""


def _transient(error: BaseException) -> bool:
    """Whether `error`, or what caused it, is the object store not answering right now — a refused or reset
    connection, a timeout, an HTTP 5xx or SlowDown — and so worth asking again; not an answer that will not
    change (403, no such bucket or key, a full local disk)."""
    from botocore.exceptions import ClientError, HTTPClientError  # s3fs's; only an object store gets here

    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, (PermissionError, FileNotFoundError)):
            return False
        if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT, errno.EROFS):
            return False
        if isinstance(error, (ConnectionError, TimeoutError, HTTPClientError)):  # refused, reset, timed out
            return True
        if isinstance(error, ClientError):
            answer = error.response or {}
            status = answer.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0
            return status >= 500 or answer.get("Error", {}).get("Code") in ("SlowDown", "ServiceUnavailable",
                                                                          "InternalError", "RequestTimeout")
        error = error.__cause__ or error.__context__  # s3fs raises an OSError caused by botocore's error
    return False


@contextmanager
def _held(directory: Path, *, exclusive: bool = False) -> Iterator[bool]:
    """A flock on `directory`'s manifest for the block: shared by readers, exclusive (without waiting) for
    eviction. Yields whether the lock is on the manifest the directory has now (False: it was evicted or replaced
    meanwhile, or someone else holds it and `exclusive` does not wait)."""
    manifest = directory / MANIFEST
    try:
        descriptor = os.open(manifest, os.O_RDONLY)
    except FileNotFoundError:
        yield False
        return
    try:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB if exclusive else fcntl.LOCK_SH)
        except BlockingIOError:
            yield False
            return
        try:
            current = os.stat(manifest).st_ino == os.fstat(descriptor).st_ino
        except FileNotFoundError:
            current = False
        yield current
    finally:
        os.close(descriptor)  # and its lock with it


def _fsync(path: Path) -> None:
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _files(directory: Path) -> list[str]:
    """The regular files under `directory`, as sorted slash-separated relative names (the manifest's order)."""
    return sorted(p.relative_to(directory).as_posix() for p in directory.rglob("*") if p.is_file())


def _cached_directories(root: Path) -> list[tuple[float, int, Path]]:
    """(last use, bytes, path) of each published directory in a host's cache: one with its manifest, whose mtime
    `fetched` sets at each use. Directories being written (`.partial`) are not counted; what an eviction
    interrupted left (`.evicted-`) is removed."""
    found = []
    for directory, subdirectories, files in os.walk(root):
        here = Path(directory)
        if MANIFEST in files:
            subdirectories.clear()
            try:
                used = os.stat(here / MANIFEST).st_mtime
                size = sum(path.stat().st_size for path in here.rglob("*") if path.is_file())
            except FileNotFoundError:  # evicted or replaced by another process meanwhile
                continue
            found.append((used, size, here))
            continue
        for name in [name for name in subdirectories if ".evicted-" in name]:
            shutil.rmtree(here / name, ignore_errors=True)
        subdirectories[:] = [name for name in subdirectories if ".partial" not in name and ".evicted-" not in name]
    return found


def check_key(key: str) -> str:
    """`key` if it is a relative path that stays under the root, else ValueError."""
    parts = key.split("/") if key else []
    if key.startswith("/") or any(part in ("", ".", "..") for part in parts) or "\\" in key or "\x00" in key:
        raise ValueError(f"{key!r} is not a storage key: a relative path of non-empty names, without . or ..")
    return key


class Storage:
    """The blobs under one root: `Storage("/var/studio")` or `Storage("s3://bucket/studio", cache=...)`."""

    def __init__(self, url: str | os.PathLike, *, cache: str | os.PathLike | None = None,
                 cache_bytes: int | None = None, outage_seconds: float | None = None):
        url = os.fspath(url)
        # Another host writes here too: a listing cached in this process would hide what it wrote.
        options = {"use_listings_cache": False} if url.startswith(("s3://", "s3a://")) else {}
        self.fs, root = fsspec.url_to_fs(url, **options)  # one file system object per process and options
        self.root = root.rstrip("/") or "/"
        self.local = isinstance(self.fs, LocalFileSystem)
        if cache is None and not self.local:
            cache = Path(tempfile.gettempdir()) / "studio-storage" / hashlib.sha256(self.url.encode()).hexdigest()[:16]
        self.cache = Path(cache) if cache is not None else None
        self.cache_root = self.cache  # what `trim_cache` keeps under cache_bytes: a child's cache is inside it
        self.cache_bytes = (int(float(os.environ.get("STUDIO_STORAGE_CACHE_BYTES", CACHE_BYTES)))
                            if cache_bytes is None else cache_bytes)
        self.outage_seconds = (float(os.environ.get("STUDIO_STORAGE_OUTAGE_SECONDS", OUTAGE_SECONDS))
                               if outage_seconds is None else outage_seconds)

    def child(self, key: str) -> Storage:
        """The storage rooted at `key` (its cache follows it)."""
        child = Storage(self.url_of(key), cache=None if self.cache is None else self.cache / check_key(key),
                        cache_bytes=self.cache_bytes, outage_seconds=self.outage_seconds)
        child.cache_root = self.cache_root
        return child

    @property
    def url(self) -> str:
        """The root: a local directory's path, or the object store's URL."""
        return self.url_of()

    def url_of(self, key: str = "") -> str:
        path = self._path(key)
        return str(Path(path)) if self.local else self.fs.unstrip_protocol(path)

    def __str__(self) -> str:
        return self.url

    def __repr__(self) -> str:
        return f"Storage({self.url!r})"

    def _path(self, key: str) -> str:
        return f"{self.root.rstrip('/')}/{check_key(key)}" if key else self.root

    def _remote(self, call, *args, **kwargs):
        """`call` on the file system; on an object store that does not answer, called again with backoff until
        it answers or `outage_seconds` have passed (StorageUnavailable). Each call it wraps is one request or an
        idempotent few (a PUT of the same bytes, a delete, a read), so asking again is harmless."""
        if self.local:
            return call(*args, **kwargs)
        deadline, pause = time.monotonic() + self.outage_seconds, 0.25
        while True:
            try:
                return call(*args, **kwargs)
            except Exception as exc:
                if not _transient(exc):
                    raise
                if time.monotonic() + pause > deadline:
                    raise StorageUnavailable(f"the object store at {self.url} did not answer for "
                                             f"{self.outage_seconds:g} s (STUDIO_STORAGE_OUTAGE_SECONDS): "
                                             f"{type(exc).__name__}: {exc}") from exc
                log.warning("the object store at %s did not answer (%s: %s); trying again in %.1f s", self.url,
                            type(exc).__name__, exc, pause)
                time.sleep(pause)
                pause = min(pause * 2, 5.0)

    # --- single blobs -------------------------------------------------------------------------------------

    def write(self, key: str, content: bytes) -> None:
        """Write the blob whole: a reader sees the old content or the new, never a part."""
        path = self._path(key)
        if self.local:
            target = Path(path)
            target.parent.mkdir(parents=True, exist_ok=True)
            temporary = target.with_name(f"{target.name}.tmp-{uuid.uuid4().hex[:8]}")
            temporary.write_bytes(content)
            os.replace(temporary, target)
        else:
            self._remote(self.fs.pipe_file, path, content)

    def write_many(self, blobs: dict[str, bytes]) -> None:
        """Write each blob whole, all at once where the store allows (s3fs sends the PUTs concurrently)."""
        if self.local:
            for key, content in blobs.items():
                self.write(key, content)
        elif blobs:
            self._remote(self.fs.pipe, {self._path(key): content for key, content in blobs.items()})

    def read(self, key: str) -> bytes:
        return self._remote(self.fs.cat_file, self._path(key))

    def upload(self, key: str, source: Path) -> None:
        """Write the blob from a local file, whole (streamed: a model's weights need not fit in memory)."""
        if self.local:
            target = Path(self._path(key))
            target.parent.mkdir(parents=True, exist_ok=True)
            temporary = target.with_name(f"{target.name}.tmp-{uuid.uuid4().hex[:8]}")
            shutil.copyfile(source, temporary)
            os.replace(temporary, target)
        else:
            self._remote(self.fs.put_file, str(source), self._path(key))

    def download(self, key: str, target: Path) -> None:
        """Copy the blob to a local file (FileNotFoundError if there is none)."""
        Path(target).parent.mkdir(parents=True, exist_ok=True)
        if self.local:
            shutil.copyfile(self._path(key), target)
        else:
            self._remote(self.fs.get_file, self._path(key), str(target))

    def listing(self, key: str = "") -> dict[str, dict]:
        """Every blob under `key`, at any depth: its key (relative to this root) -> {"bytes", and on an object store
        "etag" as the store reports it}. {} when there is none."""
        base = self._path(key).rstrip("/")
        try:
            found = self._remote(self.fs.find, base, detail=True)
        except FileNotFoundError:
            return {}
        root = self.root.rstrip("/")
        blobs = {}
        for path, info in found.items():
            if info.get("type") == "directory":
                continue
            relative = path[len(root):].lstrip("/") if path.startswith(root) else path
            entry = {"bytes": int(info.get("size") or 0)}
            if not self.local and info.get("ETag"):
                entry["etag"] = str(info["ETag"]).strip('"')
            blobs[relative] = entry
        return blobs

    def open(self, key: str):
        """A binary file object for reading (FileNotFoundError if there is no such blob)."""
        return self._remote(self.fs.open, self._path(key), "rb")

    def exists(self, key: str = "") -> bool:
        return self._remote(self.fs.exists, self._path(key))

    def names(self, key: str = "") -> list[str]:
        """The names directly under `key`, sorted ([] when there is nothing)."""
        try:
            entries = self._remote(self.fs.ls, self._path(key), detail=False)
        except FileNotFoundError:
            return []
        return sorted({entry.rstrip("/").rsplit("/", 1)[-1] for entry in entries})

    def remove(self, key: str) -> None:
        """The blob, or everything under `key`; nothing if there is none. An object store's directory leaves its
        copy in this host's cache too."""
        path = self._path(key)
        if self.local:
            target = Path(path)
            if target.is_dir():
                shutil.rmtree(target, ignore_errors=True)
            else:
                target.unlink(missing_ok=True)
            return
        try:
            self._remote(self.fs.rm, path, recursive=True)
        except FileNotFoundError:
            pass
        if self.cache is not None:
            shutil.rmtree(self.cache / key if key else self.cache, ignore_errors=True)

    # --- published directories ----------------------------------------------------------------------------

    def stage(self, key: str) -> Path:
        """A fresh, empty local directory to prepare the files of `key` in, for `publish`."""
        staging = self._staging(key)
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        return staging

    def _staging(self, key: str) -> Path:
        base = Path(self._path(key)) if self.local else self.cache / check_key(key) if key else self.cache
        return base.with_name(base.name + ".partial")

    def publish(self, key: str, directory: Path, **about) -> dict:
        """Publish the files of the local `directory` as `key`, replacing what was there; returns the manifest
        (each file's size and sha256, and `about`). A directory from `stage(key)` is consumed (moved into place,
        or into this host's cache); any other is left as it is."""
        directory = Path(directory)
        staging = self._staging(key)
        if self.local and directory != staging:  # the rename that publishes needs a copy beside the target
            shutil.rmtree(staging, ignore_errors=True)
            shutil.copytree(directory, staging)
            directory = staging
        names = [name for name in _files(directory) if name != MANIFEST]
        manifest = {**about, "files": {name: {"bytes": (directory / name).stat().st_size,
                                               "sha256": _sha256(directory / name)} for name in names}}
        encoded = json.dumps(manifest, indent=1, sort_keys=True).encode()
        if self.local:
            (staging / MANIFEST).write_bytes(encoded)
            for name in [*names, MANIFEST]:
                with (staging / name).open("rb") as handle:
                    os.fsync(handle.fileno())
            _fsync(staging)  # a rename is only as durable as the files and the directory entry under it
            final = Path(self._path(key))
            if final.exists():  # the same key published again (a resumed attempt writing the same step)
                shutil.rmtree(final)
            staging.rename(final)
            _fsync(final.parent)
            return manifest
        self._unmanifest(key)  # first: the version this one replaces stops existing before its files change
        self.remove_files(key)  # ... and its files go, or the upload of a writer that died
        for name in names:
            self._remote(self.fs.put_file, str(directory / name), self._path(f"{key}/{name}" if key else name))
        self._remote(self.fs.pipe_file, self._path(f"{key}/{MANIFEST}" if key else MANIFEST), encoded)  # last
        if directory == staging:  # this host reads it back from its cache
            (staging / MANIFEST).write_bytes(encoded)
            cached = self.cache / key if key else self.cache
            shutil.rmtree(cached, ignore_errors=True)
            staging.rename(cached)
            with _held(cached):  # the newest copy stays while older ones make room for it
                self.trim_cache()
        return manifest

    def remove_files(self, key: str) -> None:
        """What is under `key` on the object store, without touching this host's cache."""
        try:
            self._remote(self.fs.rm, self._path(key), recursive=True)
        except FileNotFoundError:
            pass

    def manifest(self, key: str = "") -> dict | None:
        """The manifest of the published directory `key`, or None (not published, or locally: published before
        manifests were written)."""
        try:
            return json.loads(self.read(f"{key}/{MANIFEST}" if key else MANIFEST))
        except (FileNotFoundError, NotADirectoryError):
            return None

    def published(self, key: str = "") -> bool:
        """Whether `key` is a published directory: locally, one renamed into place; on an object store, one
        with its manifest."""
        if self.local:
            return Path(self._path(key)).is_dir()
        return self.exists(f"{key}/{MANIFEST}" if key else MANIFEST)

    def unpublish(self, key: str) -> None:
        """Remove a published directory, its manifest first: readers stop seeing it before its files go."""
        if not self.local:
            self._unmanifest(key)
        self.remove(key)

    def _unmanifest(self, key: str) -> None:
        try:
            self._remote(self.fs.rm_file, self._path(f"{key}/{MANIFEST}" if key else MANIFEST))
        except FileNotFoundError:
            pass

    def fetch(self, key: str = "", *, into: Path | None = None) -> Path:
        """A local directory holding the published directory `key`: the directory itself when the storage is
        local (or a copy `into`), else a download checked file by file against the manifest, made once into this
        host's cache (or `into`). FileNotFoundError if it is not published. A directory of the cache may be
        evicted once no process holds it: a reader that does not read it right away holds it with `fetched`."""
        if self.local:
            path = Path(self._path(key))
            if not path.is_dir():
                raise FileNotFoundError(f"{path} does not exist: it was removed or never written")
            if into is None:
                return path
            partial = Path(into).with_name(f"{Path(into).name}.partial-{uuid.uuid4().hex[:8]}")
            shutil.copytree(path, partial)
            shutil.rmtree(into, ignore_errors=True)
            partial.rename(into)
            return Path(into)
        if into is not None:
            return self._download_again_if_changed(key, Path(into))
        with self.fetched(key) as directory:
            return directory

    @contextmanager
    def fetched(self, key: str = "") -> Iterator[Path]:
        """`fetch(key)`, kept out of reach of this host's cache eviction (other processes' included) until the
        block ends; the rest of the cache is trimmed to `cache_bytes` as it is handed out."""
        if self.local:
            yield self.fetch(key)
            return
        cached = self.cache / key if key else self.cache
        for _ in range(3):
            directory = self._download_again_if_changed(key, cached)
            with _held(directory) as current:
                if not current:  # evicted or downloaded again between the download and the lock
                    continue
                os.utime(directory / MANIFEST)  # its last use: eviction takes the least recently used first
                self.trim_cache()
                yield directory
                return
        raise StorageChanged(f"{self.url_of(key)}: this host's cached copy was evicted or replaced as soon as it "
                             "was downloaded, three times: the cache is smaller than what is in use "
                             "(STUDIO_STORAGE_CACHE_BYTES)")

    def trim_cache(self) -> list[Path]:
        """Evict the least recently used published directories of this host's cache (under `cache_root`) until it
        holds at most `cache_bytes`, whole (renamed away, then removed), never one a process holds (`fetched`, or
        being published); returns those evicted. One process trims at a time: one that finds another trimming
        leaves it to that one."""
        root = self.cache_root
        if self.local or root is None or not root.is_dir():
            return []
        guard = os.open(root, os.O_RDONLY)
        try:
            try:
                fcntl.flock(guard, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return []
            entries = _cached_directories(root)
            total, evicted = sum(size for _, size, _ in entries), []
            for _, size, directory in sorted(entries, key=lambda entry: entry[0]):
                if total <= self.cache_bytes:
                    break
                gone = directory.with_name(f"{directory.name}.evicted-{uuid.uuid4().hex[:8]}")
                with _held(directory, exclusive=True) as unused:
                    if unused:  # readers never see half of it: it leaves its place in one rename
                        directory.rename(gone)
                if unused:
                    shutil.rmtree(gone, ignore_errors=True)
                    total -= size
                    evicted.append(directory)
            if evicted:
                log.info("evicted %d directories from this host's storage cache %s (it holds %d bytes, at most %d)",
                         len(evicted), root, total, self.cache_bytes)
            return evicted
        finally:
            os.close(guard)

    def _download_again_if_changed(self, key: str, cached: Path) -> Path:
        for attempt in range(3):
            try:
                return self._download(key, cached)
            except StorageChanged:
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def _download(self, key: str, cached: Path) -> Path:
        manifest = self.manifest(key)
        if manifest is None:
            raise FileNotFoundError(f"{self.url_of(key)} is not published (no {MANIFEST}): it was removed, never "
                                    "written, or its writer died before finishing it")
        if (cached / MANIFEST).is_file() and json.loads((cached / MANIFEST).read_text()) == manifest:
            return cached
        partial = cached.with_name(f"{cached.name}.partial-{uuid.uuid4().hex[:8]}")
        partial.mkdir(parents=True)
        try:
            for name, expected in manifest["files"].items():
                target = partial / name
                target.parent.mkdir(parents=True, exist_ok=True)
                try:
                    self._remote(self.fs.get_file, self._path(f"{key}/{name}" if key else name), str(target))
                except FileNotFoundError:
                    raise StorageChanged(f"{self.url_of(key)}: {name} went away while it was read") from None
                if target.stat().st_size != expected["bytes"] or _sha256(target) != expected["sha256"]:
                    raise StorageChanged(f"{self.url_of(key)}: {name} is not the file its manifest describes")
            (partial / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True))
            shutil.rmtree(cached, ignore_errors=True)
            try:
                partial.rename(cached)
            except OSError:  # another process of this host downloaded it meanwhile
                if not (cached / MANIFEST).is_file():
                    raise
            return cached
        finally:
            shutil.rmtree(partial, ignore_errors=True)

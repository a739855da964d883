"""A host's cache of the object store stays under its size cap: after each fetch the least recently used
published directories are evicted whole, never one a process of the host — this one or another — is reading."""

import subprocess
import sys
import time
from pathlib import Path

import pytest

from workers.storage import Storage

pytestmark = pytest.mark.s3

REPOSITORY = Path(__file__).resolve().parents[3]
SIZE = 10_000  # each directory's one file; its manifest adds a few hundred bytes


@pytest.fixture
def published(object_store, tmp_path):
    """Publishes directories a..d of SIZE bytes from a host of its own; returns the storage URL."""
    writer = Storage(object_store, cache=tmp_path / "writer")
    for name in "abcd":
        staging = writer.stage(f"models/{name}")
        (staging / "weights.bin").write_bytes(name.encode() * SIZE)
        writer.publish(f"models/{name}", staging)
    return object_store


def _cached(cache: Path) -> list[str]:
    return sorted(path.name for path in (cache / "models").iterdir()) if (cache / "models").is_dir() else []


def test_the_least_recently_used_directories_are_evicted_once_the_cache_is_full(published, tmp_path):
    cache = tmp_path / "reader"
    reader = Storage(published, cache=cache, cache_bytes=int(2.5 * SIZE))  # room for two
    for name in "abc":
        reader.fetch(f"models/{name}")
        time.sleep(0.01)
    assert _cached(cache) == ["b", "c"]
    reader.fetch("models/b")  # used again: now c is the least recently used
    time.sleep(0.01)
    directory = reader.child("models").fetch("d")  # through a child of the storage: the same host cache
    assert _cached(cache) == ["b", "d"]
    assert (directory / "weights.bin").read_bytes() == b"d" * SIZE
    assert (reader.fetch("models/a") / "weights.bin").read_bytes() == b"a" * SIZE  # downloaded again
    assert _cached(cache) == ["a", "d"]


def test_a_directory_another_process_is_reading_is_never_evicted(published, tmp_path):
    cache = tmp_path / "reader"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys\nfrom workers.storage import Storage\n"
         f"with Storage({published!r}, cache={str(cache)!r}).fetched('models/a') as directory:\n"
         "    print((directory / 'weights.bin').stat().st_size, flush=True)\n"
         "    sys.stdin.readline()\n"],
        cwd=REPOSITORY, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == str(SIZE)  # it holds models/a now
        reader = Storage(published, cache=cache, cache_bytes=0)
        reader.fetch("models/b")
        reader.fetch("models/c")
        assert _cached(cache) == ["a", "c"]  # a is in use there; c was in use here while the cache was trimmed
        holder.stdin.write("done\n")
        holder.stdin.flush()
        assert holder.wait(timeout=30) == 0
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
    reader.fetch("models/d")
    assert _cached(cache) == ["d"]

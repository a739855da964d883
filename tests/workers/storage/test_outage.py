"""An object store that stops answering is waited for, as a run's database is: a storage call is tried again
with backoff for up to the outage bound, a warning each time, then fails with an error that names the storage and
the outage; an answer that will not change (no such bucket) fails at once. The outage is real: the S3 test
server behind a TCP proxy that is cut (tests/support/tcp_proxy.py). A checkpoint published through an outage:
tests/workers/rl/training/test_checkpoint_outage.py."""

import logging
import time

import pytest

from tests.support.tcp_proxy import s3_behind_proxy
from workers.storage import Storage, StorageUnavailable

pytestmark = pytest.mark.s3


def test_an_outage_longer_than_the_bound_fails_naming_the_storage_and_the_outage(object_store, tmp_path):
    with s3_behind_proxy() as proxy:
        storage = Storage(object_store, cache=tmp_path / "a", outage_seconds=2)
        storage.write("blob", b"before")
        proxy.cut()
        started = time.monotonic()
        with pytest.raises(StorageUnavailable, match=f"object store at {object_store} did not answer for 2 s"):
            storage.read("blob")
        assert time.monotonic() - started < 30  # the bound, and the last request's own retries


def test_an_answer_that_will_not_change_is_not_waited_for(object_store, tmp_path, caplog):
    missing = Storage(object_store.replace("s3://", "s3://no-such-bucket-"), cache=tmp_path / "a", outage_seconds=60)
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="workers.storage.blobs"), pytest.raises(FileNotFoundError):
        missing.write("blob", b"content")
    assert time.monotonic() - started < 10 and not caplog.records

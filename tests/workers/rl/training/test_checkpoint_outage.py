"""A checkpoint saved while the object store is away for longer than s3fs's own retries of a request: the save
waits for it (warning each time it asks again) and the checkpoint is complete once the store is back. The outage
is real: the S3 test server behind a TCP proxy cut during the upload (tests/support/tcp_proxy.py)."""

import copy
import logging
import threading
import time

import pytest
import torch

from tests.support.tcp_proxy import s3_behind_proxy
from workers.rl.models.policies import TinyLMPolicy
from workers.rl.training.checkpoint import checkpoints, load_checkpoint, save_checkpoint
from workers.storage import Storage


@pytest.mark.s3
def test_a_checkpoint_saved_through_an_object_store_outage_is_complete_once_it_is_back(
        object_store, tmp_path, addition_base_model, caplog):
    policy = TinyLMPolicy(copy.deepcopy(addition_base_model))
    bucket = object_store + "/checkpoints/run"
    with s3_behind_proxy() as proxy, caplog.at_level(logging.WARNING, logger="workers.storage.blobs"):

        def outage():
            assert proxy.wait_for_request(b"PUT ")  # the checkpoint's first file is being uploaded
            proxy.cut()
            time.sleep(20)  # longer than s3fs's and botocore's own retries of one request (7 to 13 s)
            proxy.restore()

        cutter = threading.Thread(target=outage)
        cutter.start()
        saved, _ = save_checkpoint(Storage(bucket, cache=tmp_path / "a", outage_seconds=60), step=2, policy=policy,
                                   trainer_state={"step": 2}, pipeline_state={"step": 2}, keep=3)
        cutter.join()
    assert any("did not answer" in record.getMessage() and "trying again" in record.getMessage()
               for record in caplog.records)

    [found] = checkpoints(Storage(bucket, cache=tmp_path / "b"))  # another host, straight to the server
    assert (found.step, found.size) == (2, saved.size)
    fresh = TinyLMPolicy(copy.deepcopy(addition_base_model))
    with torch.no_grad():
        for parameter in fresh.model.parameters():
            parameter.zero_()
    assert load_checkpoint(found, policy=fresh)[1] == {"step": 2}
    for name, value in policy.model.state_dict().items():
        assert torch.equal(value, fresh.model.state_dict()[name]), name

"""The weights a run publishes for its inference servers (`weights/<run id>/` in the blob storage) go when the run
ends, locally and on an S3 bucket — unless the attempt ending lost the run to another, which still serves them."""

import pytest

from apps.common import wiring
from apps.runs.attempts.base import fail_attempt
from apps.runs.models import Run, RunStatus
from apps.runs.services import run_claim, run_create


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.s3)])
def storage_url(request, settings, tmp_path):
    settings.DATA_DIR = tmp_path / "host"
    return request.getfixturevalue("object_store") if request.param == "s3" else ""


def _publish_weights(run_id, version: int) -> None:
    weights = wiring.weights_storage(run_id)
    staging = weights.stage(f"v-{version:06d}")
    (staging / "model.safetensors").write_bytes(b"weights of version %d" % version)
    weights.publish(f"v-{version:06d}", staging)


@pytest.mark.django_db
def test_a_failed_run_leaves_no_published_weights_but_a_taken_over_attempt_keeps_them(
        project, registry, owner, storage_url):
    ended = run_create(project=project, bundle=registry["bundle"], steps=4, name="ended", actor=owner)
    attempt = run_claim(run_id=ended.pk, stale_after=0)
    for version in (1, 2):
        _publish_weights(ended.pk, version)
    assert wiring.weights_storage(ended.pk).names() == ["v-000001", "v-000002"]
    fail_attempt(ended.pk, attempt, "the trainer ran out of memory")
    assert Run.objects.get(pk=ended.pk).status == RunStatus.FAILED
    assert wiring.weights_storage(ended.pk).names() == []

    taken = run_create(project=project, bundle=registry["bundle"], steps=4, name="taken", actor=owner)
    first = run_claim(run_id=taken.pk, stale_after=0)
    second = run_claim(run_id=taken.pk, stale_after=0)  # another worker took the run over
    assert second > first
    _publish_weights(taken.pk, 3)
    fail_attempt(taken.pk, first, "the old attempt's late failure")
    assert Run.objects.get(pk=taken.pk).status != RunStatus.FAILED
    assert wiring.weights_storage(taken.pk).names() == ["v-000003"]

"""Two worker hosts and a web host on one PostgreSQL, one Redis and one S3 bucket: a run starts on host A, A is
killed with SIGKILL, host B resumes the run from the checkpoint A left in the bucket, and the web host replays a
trajectory whose render A wrote. No trajectory is lost and none is written twice.

Each host is a separate `celery worker` process with a data directory of its own (nothing on one host's disk is
on another's); they share only the services and the bucket (STUDIO_STORAGE_URL). This test process is the web
host, with a third data directory. Real PostgreSQL, real Redis, moto's real S3 server over HTTP.
"""

import hashlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from django.urls import reverse

from apps.common import wiring
from apps.runs.dispatch import run_enqueue
from apps.runs.models import EventKind, MetricPoint, Run, RunStatus
from apps.runs.services import run_create
from apps.trajectories.artifacts import artifact_open
from apps.trajectories.models import Trajectory
from tests.support import ROOT
from tests.support.object_store import s3_environment
from tests.support.processes import database_url, wait_for
from tests.support.rendering_worker import RENDER_NAME, host_render

pytestmark = [pytest.mark.processes, pytest.mark.postgres, pytest.mark.redis, pytest.mark.s3,
              pytest.mark.django_db(transaction=True)]

STEPS, GROUPS, GROUP_SIZE = 10, 4, 4


def _host(tmp_path: Path, name: str, storage_url: str, *, beat: bool) -> subprocess.Popen:
    """A worker host: a gpu-queue Celery worker with its own data directory, the shared services and bucket."""
    env = {**os.environ, **s3_environment(),
           "DATABASE_URL": database_url(), "STUDIO_STORAGE_URL": storage_url,
           "STUDIO_DATA_DIR": str(tmp_path / name), "STUDIO_DEMO_PRETRAIN_SECONDS": "3",
           "STUDIO_RUN_STALE_SECONDS": "3", "STUDIO_RUN_WATCHDOG_SECONDS": "1", "STUDIO_REMOTE_ROLLOUTS": "0"}
    command = [sys.executable, "-m", "tests.support.rendering_worker", name, "-A", "studio", "worker", "-Q", "gpu",
               "-P", "solo", "-c", "1", "-n", f"{name}@%h", "--without-gossip", "--without-mingle", "-l", "INFO"]
    log = (tmp_path / f"{name}.log").open("w")
    return subprocess.Popen(command + (["-B"] if beat else []), cwd=ROOT, env=env, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=30)


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_run_started_on_one_host_resumes_on_another_from_the_bucket_and_the_web_host_replays_its_renders(
        registry, project, owner, object_store, settings, client, tmp_path):
    run = run_create(project=project, bundle=registry["bundle"], steps=STEPS, name="two-hosts", overrides={
        "mode": "sync", "groups_per_step": GROUPS, "group_size": GROUP_SIZE, "dynamic_sampling": False,
        "checkpoint_every": 2, "keep_checkpoints": 2, "eval_tasks_per_domain": 0})
    host_a = _host(tmp_path, "host-a", object_store, beat=False)
    host_b = None
    try:
        run_enqueue(run)
        # Past a checkpoint (every 2 steps) and well before the end: kill host A in the middle of a step.
        wait_for(lambda: Run.objects.get(pk=run.pk).step >= 3, seconds=240, what="step 3 on host A", logs=tmp_path)
        os.killpg(host_a.pid, signal.SIGKILL)
        host_a.wait(timeout=30)
        killed_at = Run.objects.get(pk=run.pk).step
        assert killed_at < STEPS, "the run ended before host A could be killed; make its steps longer"

        host_b = _host(tmp_path, "host-b", object_store, beat=True)  # its beat runs the watchdog
        finished = wait_for(lambda: Run.objects.filter(pk=run.pk, status__in=[RunStatus.COMPLETED, RunStatus.FAILED])
                            .first(), seconds=300, what="the run to finish on host B", logs=tmp_path)
    finally:
        _stop(host_a)
        if host_b is not None:
            _stop(host_b)

    assert finished.status == RunStatus.COMPLETED, finished.error
    assert finished.step == STEPS and finished.attempt == 2
    kinds = list(finished.events.values_list("kind", flat=True))
    assert EventKind.WORKER_LOST in kinds and EventKind.RESUMED in kinds
    resumed = finished.events.get(kind=EventKind.RESUMED).step
    assert 2 <= resumed <= killed_at and resumed % 2 == 0  # the last checkpoint A published before it died

    # The checkpoints are in the bucket, on no host's disk (B had none of its own to resume from); a host's cache
    # holds copies of what is in the bucket, and retention (keep_checkpoints=2) removed the rest from both.
    data_a, data_b = tmp_path / "host-a", tmp_path / "host-b"
    assert not (data_a / "checkpoints").exists() and not (data_b / "checkpoints").exists()
    kept = [f"step-{STEPS - 2:06d}", f"step-{STEPS:06d}"]
    stored = wiring.checkpoint_dir(run.pk)
    assert stored.names() == ["attempts", *kept]
    # Each attempt recorded where it started (A from scratch, B from A's last checkpoint): the storage's fence.
    assert {name: json.loads(stored.read(f"attempts/{name}"))["resumed_from"]
            for name in stored.names("attempts")} == {"1.json": 0, "2.json": resumed}
    assert sorted(p.name for p in (data_b / "cache" / "checkpoints" / str(run.pk)).iterdir()) == kept
    assert [c.step for c in finished.checkpoints.order_by("step")] == [STEPS - 2, STEPS]
    assert all(c.path.startswith(object_store) for c in finished.checkpoints.all())
    # B did not pretrain a base model of its own: it fetched the one A published.
    [model_a] = [p for p in (data_a / "models").glob("demo-tiny-*") if p.is_dir()]
    model_b = data_b / "models" / model_a.name
    assert _sha256(model_b / "model.safetensors") == _sha256(model_a / "model.safetensors")

    # Nothing lost: every draw of every step, with its whole group. Nothing doubled: one row per (draw, sample).
    rows = list(Trajectory.objects.filter(run=run).values_list("seq", "sample", "step", "attempt", "artifacts"))
    assert len(rows) == STEPS * GROUPS * GROUP_SIZE == len({(seq, sample) for seq, sample, *_ in rows})
    assert sorted({seq for seq, *_ in rows}) == list(range(STEPS * GROUPS))
    per_step = {}
    for _, _, step, _, _ in rows:
        per_step[step] = per_step.get(step, 0) + 1
    assert per_step == {step: GROUPS * GROUP_SIZE for step in range(1, STEPS + 1)}
    assert sorted(MetricPoint.objects.filter(run=run, name="reward/mean").values_list("step", flat=True)) == list(
        range(1, STEPS + 1))
    # Up to the checkpoint the archive is A's; after it, what A wrote was taken back and B wrote it once. Each
    # trajectory's render in the bucket is the picture its own host drew.
    for _, _, step, attempt, artifacts in rows:
        assert attempt == (1 if step <= resumed else 2)
        [render] = [a for a in artifacts if a["name"] == RENDER_NAME]
        with artifact_open(key=render["key"]) as handle:
            assert handle.read() == host_render("host-a" if attempt == 1 else "host-b")

    # The web host (this process, a data directory of its own) replays a trajectory of A's with A's render.
    settings.DATA_DIR = tmp_path / "web-host"
    by_a = Trajectory.objects.filter(run=run, attempt=1).order_by("seq", "sample").first()
    client.force_login(owner)
    page = client.get(reverse("trajectories:trajectory_detail", kwargs={"project": project.slug,
                                                                          "trajectory_id": by_a.pk}))
    url = reverse("trajectories:artifact", kwargs={"project": project.slug, "trajectory_id": by_a.pk,
                                                    "name": RENDER_NAME})
    assert page.status_code == 200 and url in page.content.decode()
    served = client.get(url)
    assert served.status_code == 200 and served["Content-Type"] == "image/png"
    assert b"".join(served.streaming_content) == host_render("host-a")

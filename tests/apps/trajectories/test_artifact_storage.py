"""Artifacts live in the blob storage: with an S3 bucket, the render a worker host archived is served by the
replay of a web host that has nothing on its own disk."""

import pytest
from django.urls import reverse

from apps.runs.services import run_claim, run_create, run_step_record
from apps.trajectories.artifacts import artifact_open
from apps.trajectories.models import Trajectory as ArchivedTrajectory
from workers.rl.types import Trajectory, TrajectoryStatus, Turn, trajectory_id
from workers.verifiers import Verdict

RENDER = b"\x89PNG\r\n\x1a\n" + b"a render drawn on the worker host"


def _archive_on_a_worker_host(run, attempt) -> None:
    rendered = Trajectory(
        id=trajectory_id(str(run.pk), 0, 0), run_id=str(run.pk), seq=0, sample=0, domain="arithmetic",
        template="task_template/add-two@1", task_key="add-00000", task_hash="0" * 64,
        image="sandbox_image/py-basic@1", verifier="verifier/numeric@1", policy_version=0, step=1, prompt_ids=[1],
        turns=[Turn(role="user", content="1+1="), Turn(role="assistant", content="2")], status=TrajectoryStatus.OK,
        reward=1.0, verdict=Verdict(reward=1.0, status="pass", layers_run=["exact"]),
        artifacts={"geometry/solid/render-iso.png": RENDER, "notes/log.txt": b"built a box"},
        started_at=1_700_000_000.0, finished_at=1_700_000_001.0)
    run_step_record(run_id=run.pk, attempt=attempt, step=1, wall_time=1_700_000_001.0, points={"reward/mean": 1.0},
                    trajectories=[rendered], events=[])


@pytest.mark.s3
def test_the_web_host_replays_a_render_that_a_worker_host_wrote(client, project, registry, owner, object_store,
                                                                 settings, tmp_path):
    run = run_create(project=project, bundle=registry["bundle"], steps=2, name="rendered", actor=owner)
    settings.DATA_DIR = tmp_path / "worker-host"
    _archive_on_a_worker_host(run, run_claim(run_id=run.pk, stale_after=0))
    row = ArchivedTrajectory.objects.get(run=run)
    assert {a["name"] for a in row.artifacts} == {"geometry/solid/render-iso.png", "notes/log.txt"}

    settings.DATA_DIR = tmp_path / "web-host"  # another host: nothing of the worker's disk
    client.force_login(owner)
    page = client.get(reverse("trajectories:trajectory_detail", kwargs={"project": project.slug,
                                                                          "trajectory_id": row.pk}))
    url = reverse("trajectories:artifact", kwargs={"project": project.slug, "trajectory_id": row.pk,
                                                    "name": "geometry/solid/render-iso.png"})
    assert page.status_code == 200 and url in page.content.decode()
    served = client.get(url)
    assert served.status_code == 200 and served["Content-Type"] == "image/png"
    assert b"".join(served.streaming_content) == RENDER
    log = client.get(url.replace("geometry/solid/render-iso.png", "notes/log.txt"))
    assert log.status_code == 200 and "attachment" in log["Content-Disposition"]
    assert not (tmp_path / "worker-host" / "artifacts").exists() and not (tmp_path / "web-host").exists()

    with pytest.raises(FileNotFoundError):
        artifact_open(key=f"{run.pk}/../../checkpoints/x")

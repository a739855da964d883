"""`manage.py backup DIR` then `manage.py restore DIR` into an empty studio (a flushed database, a new data directory
or bucket) gives the same studio back: the registry exports the same files, every run has its trajectories,
labels and checkpoints, evaluations score the same, artifacts open, and a paused run resumes from its checkpoint.
A studio that is not empty, and a damaged backup, are refused before anything is written."""

import json
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from apps.accounts.models import Project
from apps.evals import results
from apps.evals.models import Evaluation
from apps.evals.services import evaluation_launch
from apps.operations.backups import snapshot
from apps.registry.files import export_project
from apps.registry.services import version_publish
from apps.review.models import Label
from apps.review.services import item_next, label_submit, queue_create
from apps.runs.attempts import run_attempt
from apps.runs.models import Checkpoint, EventKind, Run, RunEvent, RunStatus
from apps.runs.services import run_claim, run_create, run_request
from apps.trajectories.artifacts import artifact_open
from apps.trajectories.models import Trajectory
from tests.support.specimens import RUBRIC

SUITE = {"members": ["domain/arithmetic@latest"],
         "evaluation": {"tasks_per_template": 4, "samples_per_task": 2, "temperature": 1.0, "seed": 1}}
TRAINING = {"model": "model/demo-tiny", "mode": "sync", "groups_per_step": 2, "group_size": 2,
            "eval_tasks_per_domain": 0, "checkpoint_every": 1, "keep_checkpoints": 2}


def studio_state(tmp_path: Path) -> dict:
    """What a user sees that a restore must give back: each project's registry export (every file's bytes), each
    run's status, step, trajectories, labels and checkpoints, and every evaluation's leaderboard numbers."""
    exports = {}
    for project in Project.objects.order_by("slug"):
        folder = tmp_path / f"export-{len(list(tmp_path.glob('export-*')))}"
        exports[project.slug] = {path.relative_to(folder).as_posix(): path.read_bytes()
                                 for path in export_project(project=project, directory=folder)}
    runs = {str(run.pk): (run.name, run.status, run.step, Trajectory.objects.filter(run=run).count(),
                          Label.objects.filter(item__trajectory__run=run).count(),
                          sorted(Checkpoint.objects.filter(run=run).values_list("step", flat=True)))
            for run in Run.objects.all()}
    boards = {str(e.pk): [(row.evaluation.label, row.scores, row.clean, row.overlapping, row.infra_errors, row.cost)
                          for row in results.leaderboard([e]).rows] for e in Evaluation.objects.all()}
    return {"exports": exports, "runs": runs, "leaderboards": boards}


def label_some(project, owner, count: int) -> None:
    rubric = version_publish(project=project, kind="rubric", slug="correctness", spec=RUBRIC, author=owner).version
    queue = queue_create(project=project, slug="q", rubric=rubric, actor=owner, reviewers=[owner],
                         sampling={"rule": "random", "n": count})
    for _ in range(count):
        item = item_next(queue=queue, reviewer=owner)
        label_submit(queue=queue, item_id=item.pk, reviewer=owner, answers={"verdict": "correct"})


def emptied(settings, tmp_path: Path, storage_url: str = "") -> None:
    """The studio made empty as a new one is: its tables flushed, a new data directory, and a new bucket."""
    call_command("flush", interactive=False, verbosity=0)
    settings.DATA_DIR = tmp_path / "restored-data"
    settings.STORAGE_URL = storage_url


def restore(directory: Path) -> str:
    import io

    out = io.StringIO()
    call_command("restore", str(directory), stdout=out)
    return out.getvalue()


@pytest.mark.django_db(transaction=True)  # pg_dump reads what is committed
def test_a_synthetic_studio_round_trips_and_a_non_empty_one_is_refused(settings, tmp_path, project, owner,
                                                                        studio_run):
    run, _ = studio_run
    label_some(project, owner, 4)
    before = studio_state(tmp_path)
    artifacts = [entry["key"] for t in Trajectory.objects.filter(run=run) for entry in t.artifacts]
    assert artifacts, "the synthetic run's 3D trajectories carry rendered views"
    with artifact_open(key=artifacts[0]) as handle:
        first_artifact = handle.read()

    backup = tmp_path / "backup"
    call_command("backup", str(backup), stdout=open(tmp_path / "backup.log", "w"))
    manifest = json.loads((backup / "manifest.json").read_text())
    assert manifest["database"]["tables"]["trajectories_trajectory"] == 90
    assert manifest["storage"]["objects"] == len(manifest["blobs"]) >= len(artifacts)
    assert manifest["settings"]["secrets_set"]["SECRET_KEY"] is True
    assert settings.SECRET_KEY not in (backup / "manifest.json").read_text()
    with pytest.raises(CommandError, match="is not empty: give a new directory"):
        call_command("backup", str(backup))
    with pytest.raises(CommandError, match=r"this studio is not empty: its database holds rows in .*accounts_"):
        restore(backup)

    emptied(settings, tmp_path)
    damaged = tmp_path / "damaged"
    import shutil

    shutil.copytree(backup, damaged)
    (damaged / "blobs" / "artifacts" / artifacts[0]).write_bytes(b"not the render")
    with pytest.raises(CommandError, match="the backup is damaged, nothing was restored: artifacts/"):
        restore(damaged)
    assert not Run.objects.exists() and not (settings.DATA_DIR / "artifacts").exists()

    said = restore(backup)
    assert "restored and checked" in said
    assert studio_state(tmp_path) == before
    with artifact_open(key=artifacts[0]) as handle:
        assert handle.read() == first_artifact
    with pytest.raises(CommandError, match="this studio is not empty"):
        restore(backup)


@pytest.mark.postgres
@pytest.mark.s3
@pytest.mark.sandbox
@pytest.mark.django_db(transaction=True)  # the training attempts commit as a worker's do
def test_a_studio_on_postgresql_and_s3_round_trips_and_its_paused_run_resumes(settings, tmp_path, project, registry,
                                                                              owner, object_store):
    from tests.support.object_store import new_bucket

    settings.DEMO_PRETRAIN_SECONDS = 2
    settings.REMOTE_ROLLOUTS = False
    suite = version_publish(project=project, kind="bundle", slug="arith-suite", spec=SUITE, author=owner).version
    tiny = version_publish(project=project, kind="model", slug="demo-tiny",
                           spec={"source": {"type": "builtin", "name": "demo-tiny"}}, author=owner).version
    run = run_create(project=project, bundle=registry["bundle"], steps=3, overrides=TRAINING, name="learner",
                     actor=owner)
    attempt = run_claim(run_id=run.pk, stale_after=0)
    run_request(run=run, action="pause", actor=owner)  # the attempt checkpoints its first step and pauses
    run_attempt(run_id=run.pk, attempt=attempt)
    run.refresh_from_db()
    assert (run.status, run.step) == (RunStatus.PAUSED, 1)
    evaluation = evaluation_launch(project=project, suite=suite, actor=owner, model=tiny)
    run_attempt(run_id=evaluation.run_id, attempt=run_claim(run_id=evaluation.run_id, stale_after=0))
    label_some(project, owner, 2)
    before = studio_state(tmp_path)
    assert before["leaderboards"][str(evaluation.pk)][0][1][results.ALL].tasks == 4

    backup = tmp_path / "backup"
    call_command("backup", str(backup), stdout=open(tmp_path / "backup.log", "w"))
    manifest = json.loads((backup / "manifest.json").read_text())
    assert manifest["database"]["vendor"] == "postgresql" and (backup / "database.pgdump").is_file()
    assert all(entry["etag"] for entry in manifest["blobs"].values())  # the bucket's listing, with its ETags
    assert any(key.startswith("models/demo-tiny-") for key in manifest["blobs"])

    emptied(settings, tmp_path, storage_url=f"s3://{new_bucket()}/studio")
    said = restore(backup)
    assert "restored and checked" in said
    assert studio_state(tmp_path) == before
    assert all(path.startswith(settings.STORAGE_URL) for path in Checkpoint.objects.values_list("path", flat=True))

    # The paused run resumes on the restored studio, from its checkpoint in the new bucket, with the base model
    # it started from (this data directory has none: it comes from the bucket's models/).
    run_request(run=run, action="resume", actor=owner, enqueue=False)
    run_attempt(run_id=run.pk, attempt=run_claim(run_id=run.pk, stale_after=0))
    run.refresh_from_db()
    assert (run.status, run.step) == (RunStatus.COMPLETED, 3)
    resumed = RunEvent.objects.filter(run=run, kind=EventKind.RESUMED).values_list("message", flat=True)
    assert any("step 1" in message for message in resumed), list(resumed)
    assert snapshot.read_manifest(backup)["fingerprint"]["runs"][str(run.pk)]["step"] == 1

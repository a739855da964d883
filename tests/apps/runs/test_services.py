"""The run services (apps/runs/services.py), on the database alone: creating runs, the owner's requests, claims
and the fencing that keeps a presumed-dead worker from writing, and what a worker's step, rollback, checkpoint
and finish leave behind."""

from datetime import timedelta

import pytest
from django.utils import timezone

from apps.accounts.models import AuditEvent
from apps.runs.models import Checkpoint, EventKind, MetricPoint, Run, RunEvent, RunRequest, RunStatus
from apps.runs.services import (
    RunError,
    RunLeaseLost,
    run_checkpoint_record,
    run_claim,
    run_create,
    run_event_record,
    run_finish,
    run_heartbeat,
    run_request,
    run_rollback,
    run_step_record,
    runs_requeue_lost,
)
from apps.trajectories.artifacts import artifact_open
from apps.trajectories.models import Trajectory as ArchivedTrajectory
from workers.rl.types import Trajectory, TrajectoryStatus, Turn, trajectory_id
from workers.verifiers import Verdict

STALE = 60.0  # seconds without a heartbeat before a running run's worker is presumed lost


@pytest.fixture
def run(project, registry, owner):
    return run_create(project=project, bundle=registry["bundle"], steps=10, name="services", actor=owner)


def claimed(run, worker="first:1") -> int:
    attempt = run_claim(run_id=run.pk, stale_after=STALE, worker=worker)
    assert attempt is not None
    return attempt


def go_quiet(run, seconds: float = 2 * STALE) -> None:
    """The run's worker stops heartbeating: its last heartbeat is `seconds` old."""
    Run.objects.filter(pk=run.pk).update(heartbeat_at=timezone.now() - timedelta(seconds=seconds))


def trajectory(run, *, seq: int, sample: int = 0, step: int, reward: float = 1.0, artifacts=None) -> Trajectory:
    return Trajectory(
        id=trajectory_id(str(run.pk), seq, sample), run_id=str(run.pk), seq=seq, sample=sample, domain="arithmetic",
        template="task_template/add-two@1", task_key=f"add-{seq:05d}", task_hash="0" * 64,
        image="sandbox_image/py-basic@1", verifier="verifier/numeric@1", policy_version=step - 1, step=step,
        prompt_ids=[1, 2, 3], turns=[Turn(role="user", content="1+1="), Turn(role="assistant", content="2",
                                                                                token_ids=[7], logprobs=[-0.1])],
        status=TrajectoryStatus.OK, reward=reward, verdict=Verdict(reward=reward, status="pass", layers_run=["exact"]),
        artifacts=artifacts or {}, started_at=1_700_000_000.0, finished_at=1_700_000_001.0)


def step(run, attempt: int, number: int, *, value: float = 0.5, trajectories=(), events=()) -> None:
    run_step_record(run_id=run.pk, attempt=attempt, step=number, wall_time=1_700_000_000.0 + number,
                    points={"reward/mean": value}, trajectories=list(trajectories), events=list(events))


def kinds(run) -> list[str]:
    return list(RunEvent.objects.filter(run=run).values_list("kind", flat=True))


# --- creating ------------------------------------------------------------------------------------------------

def test_a_new_run_is_queued_with_its_config_resolved_and_an_audit_row(run, owner, registry):
    assert run.status == RunStatus.QUEUED and run.attempt == 0 and run.step == 0 and run.steps_total == 10
    assert run.bundle == registry["bundle"] and run.created_by == owner
    assert run.config["group_size"] >= 1 and len(run.config_hash) == 64  # every setting present, defaults filled
    assert kinds(run) == [EventKind.CREATED]
    audit = AuditEvent.objects.get(action="run.create")
    assert audit.target == f"run/{run.pk}" and audit.details["bundle"] == "bundle/arith-bundle@1"


def test_create_refuses_what_is_not_a_bundle_of_the_project_bad_steps_and_bad_settings(project, registry, owner):
    with pytest.raises(RunError, match="verifier/numeric@1 is not a bundle of project acme-rl"):
        run_create(project=project, bundle=registry["verifier"], steps=5, actor=owner)
    for steps in (0, -1, 2.5, "10"):
        with pytest.raises(RunError, match="steps must be a whole number of at least 1"):
            run_create(project=project, bundle=registry["bundle"], steps=steps, actor=owner)
    with pytest.raises(RunError, match="config: no_such_option: unknown setting"):
        run_create(project=project, bundle=registry["bundle"], steps=5, overrides={"no_such_option": 1})
    assert not Run.objects.exists() and not AuditEvent.objects.filter(action="run.create").exists()


def test_a_bundle_recommends_run_settings_and_a_run_overrides_them(project, registry, owner):
    """A bundle's run_config (the model its tasks are sized for) is where a run starts; its own settings win.
    A bad run_config is refused when the bundle is published, naming the field; an empty one is left out of the
    spec, so bundles published before the field existed keep their content hash."""
    from apps.registry.errors import SpecError
    from apps.registry.services import version_publish

    def publish(slug, spec):
        return version_publish(project=project, kind="bundle", slug=slug, spec=spec, author=owner).version

    members = {"members": ["domain/arithmetic@latest"]}
    sized = publish("sized", {**members, "run_config": {"group_size": 4, "learning_rate": 1e-4, "temperature": 0.7}})
    run = run_create(project=project, bundle=sized, steps=3, overrides={"temperature": 1.2}, actor=owner)
    assert (run.config["group_size"], run.config["learning_rate"], run.config["temperature"]) == (4, 1e-4, 1.2)
    with pytest.raises(SpecError, match="run_config: group_size: must be between 2|run_config: group_size: GRPO"):
        publish("bad", {**members, "run_config": {"group_size": 1}})
    with pytest.raises(SpecError, match="run_config: no_such: unknown setting"):
        publish("bad", {**members, "run_config": {"no_such": 1}})
    empty = publish("plain", {**members, "run_config": {}})
    assert "run_config" not in empty.spec and empty.content_hash == publish("plain-2", members).content_hash


# --- claims and fencing ----------------------------------------------------------------------------------------

def test_a_claim_bumps_the_attempt_and_a_live_run_cannot_be_claimed_again(run):
    assert claimed(run, "first:1") == 1
    run.refresh_from_db()
    assert run.status == RunStatus.RUNNING and run.worker == "first:1" and run.started_at and run.heartbeat_at
    assert run_claim(run_id=run.pk, stale_after=STALE, worker="second:2") is None  # its worker is alive
    started = RunEvent.objects.get(run=run, kind=EventKind.STARTED)
    assert started.attempt == 1 and started.message == "attempt 1 on first:1"


def test_a_stale_running_run_is_taken_over_and_the_old_attempt_is_fenced_off(run):
    old = claimed(run, "first:1")
    step(run, old, 1, trajectories=[trajectory(run, seq=0, step=1)])
    go_quiet(run)
    new = run_claim(run_id=run.pk, stale_after=STALE, worker="second:2")
    assert new == old + 1
    lost = RunEvent.objects.get(run=run, kind=EventKind.WORKER_LOST)
    assert lost.details == {"worker": "first:1", "attempt": old} and "first:1 stopped answering" in lost.message
    run.refresh_from_db()
    assert run.worker == "second:2" and run.attempt == new

    # The old worker comes back: every write it tries is refused, and none of it lands.
    before = (kinds(run), list(MetricPoint.objects.values_list("step", "value")),
              list(ArchivedTrajectory.objects.values_list("id", "reward")), Checkpoint.objects.count())
    writes = [
        lambda: run_heartbeat(run_id=run.pk, attempt=old),
        lambda: step(run, old, 2, value=0.9, trajectories=[trajectory(run, seq=1, step=2)],
                     events=[(EventKind.RETRY, "retried", {})]),
        lambda: step(run, old, 1, value=0.1, trajectories=[trajectory(run, seq=0, step=1, reward=0.0)]),
        lambda: run_rollback(run_id=run.pk, attempt=old, step=0),
        lambda: run_checkpoint_record(run_id=run.pk, attempt=old, step=2, path="/nowhere", size=1),
        lambda: run_event_record(run_id=run.pk, attempt=old, kind=EventKind.RETRY, message="retried"),
        lambda: run_finish(run_id=run.pk, attempt=old, status=RunStatus.COMPLETED, summary={"steps": 2}),
    ]
    for write in writes:
        with pytest.raises(RunLeaseLost, match=f"at attempt {new} \\(running\\); this worker holds {old}"):
            write()
    after = (kinds(run), list(MetricPoint.objects.values_list("step", "value")),
             list(ArchivedTrajectory.objects.values_list("id", "reward")), Checkpoint.objects.count())
    assert after == before
    run.refresh_from_db()
    assert (run.status, run.step, run.attempt, run.summary) == (RunStatus.RUNNING, 1, new, {})
    assert run_heartbeat(run_id=run.pk, attempt=new) == RunRequest.NONE  # the new attempt writes on


def test_only_queued_or_stale_running_runs_can_be_claimed(run, project, registry):
    assert run_claim(run_id="00000000-0000-4000-8000-00000000dead", stale_after=STALE) is None
    run_request(run=run, action="pause", actor=None)
    assert run_claim(run_id=run.pk, stale_after=STALE) is None  # paused: resume queues it first
    finished = run_create(project=project, bundle=registry["bundle"], steps=1)
    attempt = claimed(finished)
    run_finish(run_id=finished.pk, attempt=attempt, status=RunStatus.COMPLETED)
    go_quiet(finished)
    assert run_claim(run_id=finished.pk, stale_after=STALE) is None


def test_requeue_lost_queues_only_the_runs_whose_heartbeat_went_stale(run, project, registry):
    quiet_attempt = claimed(run, "quiet:1")
    step(run, quiet_attempt, 3)
    alive = run_create(project=project, bundle=registry["bundle"], steps=10)
    claimed(alive, "alive:2")
    queued = run_create(project=project, bundle=registry["bundle"], steps=10)
    go_quiet(run)

    assert [r.pk for r in runs_requeue_lost(stale_after=STALE)] == [run.pk]
    assert {r.pk: r.status for r in Run.objects.all()} == {
        run.pk: RunStatus.QUEUED, alive.pk: RunStatus.RUNNING, queued.pk: RunStatus.QUEUED}
    lost = RunEvent.objects.get(run=run, kind=EventKind.WORKER_LOST)
    assert lost.step == 3 and "quiet:1 stopped answering at step 3" in lost.message
    assert not RunEvent.objects.filter(run__in=[alive, queued], kind=EventKind.WORKER_LOST).exists()
    assert runs_requeue_lost(stale_after=STALE) == []  # once is enough

    # Requeued, not yet claimed: the lost worker is already fenced off; the next claim resumes the run.
    with pytest.raises(RunLeaseLost, match="\\(queued\\)"):
        run_heartbeat(run_id=run.pk, attempt=quiet_attempt)
    assert claimed(run, "next:3") == quiet_attempt + 1
    assert kinds(run).count(EventKind.WORKER_LOST) == 1  # a queued run was not running: no second worker_lost


def test_a_lost_worker_event_names_the_checkpoint_the_run_resumes_from(run, project, registry):
    """Stopped at step 5 with its newest checkpoint at step 4: the run resumes at 4, not at 5, and says so."""
    attempt = claimed(run, "quiet:1")
    for number in range(1, 6):
        step(run, attempt, number)
        if number % 2 == 0:
            run_checkpoint_record(run_id=run.pk, attempt=attempt, step=number, path=f"/ckpt/{number}", size=1)
    go_quiet(run)
    runs_requeue_lost(stale_after=STALE)
    lost = RunEvent.objects.get(run=run, kind=EventKind.WORKER_LOST)
    assert lost.message == ("worker quiet:1 stopped answering at step 5; queued to resume from its checkpoint at "
                            "step 4 (step 5 is trained again)")

    # Taken over by a claim, several steps past the checkpoint.
    attempt = claimed(run, "next:2")
    for number in range(6, 9):
        step(run, attempt, number)
    go_quiet(run)
    attempt = claimed(run, "third:3")
    lost = RunEvent.objects.filter(run=run, kind=EventKind.WORKER_LOST).last()
    assert lost.step == 8 and lost.message == ("worker next:2 stopped answering at step 8; taken over to resume from "
                                               "its checkpoint at step 4 (steps 5-8 are trained again)")

    # Paused: the pipeline checkpoints the step it pauses at, and the event names it.
    step(run, attempt, 9)
    run_checkpoint_record(run_id=run.pk, attempt=attempt, step=9, path="/ckpt/9", size=1)
    run_finish(run_id=run.pk, attempt=attempt, status=RunStatus.PAUSED)
    assert RunEvent.objects.get(run=run, kind=EventKind.PAUSED).message == (
        "paused at step 9, to resume from its checkpoint at step 9")

    # No checkpoint yet: from the start.
    early = run_create(project=project, bundle=registry["bundle"], steps=10)
    step(early, claimed(early, "early:4"), 1)
    go_quiet(early)
    runs_requeue_lost(stale_after=STALE)
    assert RunEvent.objects.get(run=early, kind=EventKind.WORKER_LOST).message == (
        "worker early:4 stopped answering at step 1; queued to resume from the start: it saved no checkpoint")


# --- the owner's requests ----------------------------------------------------------------------------------------

def test_pause_resume_and_cancel_a_queued_run(run, owner):
    run = run_request(run=run, action="pause", actor=owner)
    assert run.status == RunStatus.PAUSED and run.requested == RunRequest.NONE
    with pytest.raises(RunError, match="^a paused run cannot be paused$"):
        run_request(run=run, action="pause", actor=owner)
    run = run_request(run=run, action="resume", actor=owner)
    assert run.status == RunStatus.QUEUED
    with pytest.raises(RunError, match="^only a paused or interrupted run can be resumed; this one is queued$"):
        run_request(run=run, action="resume", actor=owner)
    run = run_request(run=run, action="cancel", actor=owner, via="api")
    assert run.status == RunStatus.CANCELLED and run.finished_at is not None
    for action, message in (("cancel", "the run is already cancelled"), ("pause", "a cancelled run cannot be paused"),
                            ("resume", "only a paused or interrupted run can be resumed; this one is cancelled"),
                            ("stop", "unknown action 'stop'; use pause, resume or cancel")):
        with pytest.raises(RunError, match=f"^{message}$"):
            run_request(run=run, action=action, actor=owner)
    assert kinds(run) == [EventKind.CREATED, EventKind.PAUSED, EventKind.REQUESTED, EventKind.CANCELLED]
    audit = list(AuditEvent.objects.filter(target=f"run/{run.pk}").order_by("created_at", "id")
                 .values_list("action", "via"))
    assert audit == [("run.create", "web"), ("run.pause", "web"), ("run.resume", "web"), ("run.cancel", "api")]


def test_a_running_run_is_asked_and_its_worker_decides_at_the_step_boundary(run, owner):
    attempt = claimed(run)
    run = run_request(run=run, action="pause", actor=owner)
    assert run.status == RunStatus.RUNNING and run.requested == RunRequest.PAUSE and run.finished_at is None
    assert run_heartbeat(run_id=run.pk, attempt=attempt) == RunRequest.PAUSE
    run_finish(run_id=run.pk, attempt=attempt, status=RunStatus.PAUSED)
    run.refresh_from_db()
    assert (run.status, run.requested, run.finished_at) == (RunStatus.PAUSED, RunRequest.NONE, None)
    run = run_request(run=run, action="resume", actor=owner)
    assert run.status == RunStatus.QUEUED

    attempt = claimed(run)
    assert attempt == 2
    run = run_request(run=run, action="cancel", actor=owner)
    assert run.status == RunStatus.RUNNING and run.requested == RunRequest.CANCEL
    assert run_heartbeat(run_id=run.pk, attempt=attempt) == RunRequest.CANCEL
    run_finish(run_id=run.pk, attempt=attempt, status=RunStatus.CANCELLED)
    run.refresh_from_db()
    assert run.status == RunStatus.CANCELLED and run.requested == RunRequest.NONE and run.finished_at is not None
    messages = list(RunEvent.objects.filter(run=run, kind=EventKind.REQUESTED).values_list("message", flat=True))
    assert messages[0].startswith("pause requested") and messages[-1].startswith("cancel requested")


def test_an_interrupted_run_says_where_it_resumes_and_is_claimed_at_once_by_the_next_worker(run, owner):
    attempt = claimed(run)
    step(run, attempt, 3)
    run_checkpoint_record(run_id=run.pk, attempt=attempt, step=2, path="/ckpt/2", size=1)
    run_finish(run_id=run.pk, attempt=attempt, status=RunStatus.INTERRUPTED, summary={"outcome": "interrupted"})
    run.refresh_from_db()
    assert (run.status, run.requested, run.finished_at) == (RunStatus.INTERRUPTED, RunRequest.NONE, None)
    assert RunEvent.objects.get(run=run, kind=EventKind.INTERRUPTED).message == (
        "interrupted at step 3 (its process was asked to stop), to resume from its checkpoint at step 2 "
        "(step 3 is trained again)")
    # Its heartbeat is fresh, yet nobody holds it: the next worker takes it without waiting, and no worker was lost.
    assert claimed(run, "next:2") == attempt + 1
    assert not RunEvent.objects.filter(run=run, kind=EventKind.WORKER_LOST).exists()
    with pytest.raises(RunLeaseLost):
        run_heartbeat(run_id=run.pk, attempt=attempt)


# --- a worker's writes -----------------------------------------------------------------------------------------

def test_a_step_is_recorded_once_per_run_name_and_step_and_its_trajectories_are_archived(run, data_dir):
    attempt = claimed(run)
    render = b"\x89PNG\r\n\x1a\n" + b"picture"
    first = [trajectory(run, seq=0, sample=0, step=1, reward=1.0, artifacts={"geometry/render.png": render}),
             trajectory(run, seq=0, sample=1, step=1, reward=0.0)]
    step(run, attempt, 1, value=0.5, trajectories=first, events=[(EventKind.RETRY, "sandbox retried", {"n": 1})])
    run.refresh_from_db()
    assert run.step == 1
    rows = {row.sample: row for row in ArchivedTrajectory.objects.filter(run=run)}
    assert set(rows) == {0, 1} and rows[0].reward == 1.0 and rows[0].attempt == attempt
    assert rows[0].num_turns == 1 and rows[0].completion_tokens == 1 and rows[0].deciding_layer == "exact"
    [artifact] = rows[0].artifacts
    assert artifact["name"] == "geometry/render.png" and artifact["content_type"] == "image/png"
    with artifact_open(key=artifact["key"]) as handle:
        assert handle.read() == render
    assert (data_dir / "artifacts" / artifact["key"]).is_file()  # in this test's data directory
    retry = RunEvent.objects.get(run=run, kind=EventKind.RETRY)
    assert (retry.step, retry.attempt, retry.details) == (1, attempt, {"n": 1})

    # The same step again (a replay): the point is overwritten, the trajectories too, nothing is added.
    step(run, attempt, 1, value=0.75, trajectories=[trajectory(run, seq=0, sample=0, step=1, reward=0.25)])
    assert list(MetricPoint.objects.filter(run=run).values_list("name", "step", "value")) == [
        ("reward/mean", 1, 0.75)]
    assert dict(ArchivedTrajectory.objects.filter(run=run).values_list("sample", "reward")) == {0: 0.25, 1: 0.0}

    # A late write of an earlier step never moves the run back.
    step(run, attempt, 3)
    step(run, attempt, 2)
    run.refresh_from_db()
    assert run.step == 3 and MetricPoint.objects.filter(run=run).count() == 3


def test_rollback_takes_back_what_was_written_after_the_step(run):
    attempt = claimed(run)
    for number in (1, 2, 3):
        step(run, attempt, number, trajectories=[trajectory(run, seq=number - 1, step=number)])
    run_rollback(run_id=run.pk, attempt=attempt, step=1)
    run.refresh_from_db()
    assert run.step == 1
    assert list(MetricPoint.objects.filter(run=run).values_list("step", flat=True)) == [1]
    assert list(ArchivedTrajectory.objects.filter(run=run).values_list("step", flat=True)) == [1]
    step(run, attempt, 2, trajectories=[trajectory(run, seq=1, step=2)])  # written again by this attempt
    assert sorted(ArchivedTrajectory.objects.filter(run=run).values_list("step", flat=True)) == [1, 2]


def test_checkpoints_are_recorded_replaced_and_pruned(run):
    attempt = claimed(run)
    run_checkpoint_record(run_id=run.pk, attempt=attempt, step=2, path="/ckpt/2", size=2_000_000)
    run_checkpoint_record(run_id=run.pk, attempt=attempt, step=4, path="/ckpt/4", size=1, removed=[2])
    run_checkpoint_record(run_id=run.pk, attempt=attempt, step=4, path="/ckpt/4b", size=4_000_000)
    assert list(Checkpoint.objects.filter(run=run).values_list("step", "path", "bytes")) == [(4, "/ckpt/4b", 4_000_000)]
    saved = RunEvent.objects.filter(run=run, kind=EventKind.CHECKPOINT_SAVED).order_by("id")
    assert [(e.step, e.details["path"]) for e in saved] == [(2, "/ckpt/2"), (4, "/ckpt/4"), (4, "/ckpt/4b")]
    assert saved.first().message == "checkpoint at step 2 (2.0 MB)"


def test_finish_records_the_outcome_and_ends_the_attempt(run):
    attempt = claimed(run)
    step(run, attempt, 1)
    run_request(run=run, action="pause", actor=None)  # asked, then the run completes first
    run_finish(run_id=run.pk, attempt=attempt, status=RunStatus.COMPLETED, summary={"outcome": "completed", "steps": 1})
    run.refresh_from_db()
    assert (run.status, run.requested, run.summary, run.error) == (
        RunStatus.COMPLETED, RunRequest.NONE, {"outcome": "completed", "steps": 1}, "")
    assert run.finished_at is not None
    done = RunEvent.objects.get(run=run, kind=EventKind.COMPLETED)
    assert (done.message, done.step, done.attempt) == ("completed 1 steps", 1, attempt)
    with pytest.raises(RunLeaseLost, match="\\(completed\\)"):
        run_heartbeat(run_id=run.pk, attempt=attempt)  # a finished run has no current attempt


def test_a_failed_run_keeps_its_error_and_its_summary_stays_unless_given(project, registry):
    run = run_create(project=project, bundle=registry["bundle"], steps=5)
    attempt = claimed(run)
    run_finish(run_id=run.pk, attempt=attempt, status=RunStatus.FAILED, error="RuntimeError: the sandbox broke")
    run.refresh_from_db()
    assert (run.status, run.error, run.summary) == (RunStatus.FAILED, "RuntimeError: the sandbox broke", {})
    assert run.finished_at is not None
    assert RunEvent.objects.get(run=run, kind=EventKind.FAILED).message == "failed: RuntimeError: the sandbox broke"

"""Writes for the trajectory archive: idempotent by trajectory id, called inside the run's step transaction."""

from __future__ import annotations

from datetime import UTC, datetime

from workers.rl.types import Trajectory as EngineTrajectory

from .artifacts import artifact_key, artifacts_put
from .models import Trajectory

UPDATED_FIELDS = [f.name for f in Trajectory._meta.concrete_fields if f.name not in ("id", "project", "run", "seq",
                                                                                        "sample")]


def _timestamp(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds or 0, tz=UTC)


def trajectory_row(*, run, attempt: int, trajectory: EngineTrajectory, stored: list[dict]) -> Trajectory:
    """An archive row from the engine's trajectory; `stored`: its artifacts' entries, already in the store."""
    t = trajectory
    return Trajectory(
        id=t.id, project_id=run.project_id, run=run, seq=t.seq, sample=t.sample, attempt=attempt,
        domain=t.domain, template=t.template, task_key=t.task_key, task_hash=t.task_hash, image=t.image,
        verifier=t.verifier, policy_version=t.policy_version, step=t.step, effective=t.effective,
        advantage=t.advantage, status=str(t.status), status_reason=t.status_reason, reward=t.reward,
        verdict_status=t.verdict.status if t.verdict else "",
        # the last layer that ran is the one that decided
        deciding_layer=t.verdict.layers_run[-1] if t.verdict and t.verdict.layers_run else "",
        num_turns=sum(turn.role == "assistant" for turn in t.turns),
        num_tool_calls=sum(len(turn.tool_calls) for turn in t.turns), completion_tokens=t.completion_tokens,
        duration_s=t.timings.get("total", 0.0), cost=t.costs.get("total", 0.0), prompt_ids=list(t.prompt_ids),
        turns=[turn.to_json() for turn in t.turns], verdict=t.verdict.to_json() if t.verdict else {},
        timings=t.timings, costs=t.costs,
        artifacts=stored, started_at=_timestamp(t.started_at), finished_at=_timestamp(t.finished_at))


def trajectories_record(*, run, attempt: int, trajectories: list[EngineTrajectory]) -> int:
    """Insert or overwrite by id: the newest attempt's version of a trajectory is the archived one."""
    if not trajectories:
        return 0
    # The batch's artifacts go to the store together (concurrently on an object store), keyed by trajectory id.
    blobs = [{artifact_key(run_id=run.pk, trajectory_id=t.id, name=name): content
              for name, content in t.artifacts.items()} for t in trajectories]
    stored = artifacts_put(contents={key: content for own in blobs for key, content in own.items()})
    rows = [trajectory_row(run=run, attempt=attempt, trajectory=t, stored=[stored[key] for key in own])
            for t, own in zip(trajectories, blobs, strict=True)]
    Trajectory.objects.bulk_create(rows, update_conflicts=True, unique_fields=["id"], update_fields=UPDATED_FIELDS)
    return len(rows)

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
    data = trajectory.to_json()
    verdict = data.get("verdict") or {}
    turns = data.get("turns", [])
    return Trajectory(
        id=data["id"], project_id=run.project_id, run=run, seq=data["seq"], sample=data["sample"], attempt=attempt,
        domain=data["domain"], template=data["template"], task_key=data["task_key"], task_hash=data["task_hash"],
        image=data["image"], verifier=data["verifier"], policy_version=data["policy_version"],
        step=data["step"], effective=data.get("effective"), advantage=data.get("advantage"),
        status=data["status"], status_reason=data.get("status_reason", ""), reward=data.get("reward"),
        verdict_status=verdict.get("status", ""),
        deciding_layer=(verdict.get("layers_run") or [""])[-1],  # the last layer that ran is the one that decided
        num_turns=sum(t["role"] == "assistant" for t in turns),
        num_tool_calls=sum(len(t.get("tool_calls", [])) for t in turns),
        completion_tokens=sum(len(t.get("token_ids", [])) for t in turns if t["role"] == "assistant"),
        duration_s=data.get("timings", {}).get("total", 0.0), cost=data.get("costs", {}).get("total", 0.0),
        prompt_ids=data.get("prompt_ids", []), turns=turns, verdict=verdict, timings=data.get("timings", {}),
        costs=data.get("costs", {}), artifacts=stored, started_at=_timestamp(data.get("started_at")),
        finished_at=_timestamp(data.get("finished_at")))


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

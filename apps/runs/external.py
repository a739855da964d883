"""Runs trained elsewhere: a trainer of its own (TRL, verifiers, verl ...) plays a bundle's environments through
`manage.py environments serve` (apps/environments), and each episode it plays is recorded here as a trajectory of a
run of kind `external`, the run its client names.

The pages read a run through what its trainer writes: archived trajectories and metric points by step. An external
run gets both from the writers ours use (services.run_step_record: the points, the archive's writer, the
trajectories_archived signal that review queues follow, the live updates), so the run page, the replay, review
queues, dataset export and the leaderboard's overlap check read it as they read ours. What only a trainer of ours
knows is not made up: an external run has no checkpoints, losses, KL or idle time.

An episode's step is the trainer's step as its client reports it (none: the episode's number in the run). A step's
points are recomputed as each of its episodes arrives: the step's episodes so far (reward/mean and per domain over
those scored; turns and tool calls; the episodes that timed out, broke the protocol, were abandoned or lost to the
infrastructure) and the run's totals at its newest episode (trajectories and effective trajectories per active
hour, cost per task and in all), kept in the run's summary.

Effective: a trainer elsewhere does not say what it trained on. An episode counts as effective when its group —
the run's episodes of the same task at the same trainer step, as GRPO-family trainers (TRL, verl, prime-rl) sample a
task's completions together — holds reward variance, the test our GRPO makes before training on a group. A trainer
that plays each task once per step has no effective episode, and the page says so as it would for ours.

Active time, which the rates are over: the time some episode was being played, with the gaps between episodes
counted unless one is longer than PAUSE_SECONDS (a trainer updating its weights between steps is working; one
stopped for the night is not), as our runs count only the time an attempt ran them.

Concurrency: an episode is recorded in one transaction that holds the run's row, so the episodes of many sessions
are counted one after another, and an episode that arrives after the run was finished is refused.
"""

from __future__ import annotations

import uuid
from dataclasses import replace

from django.db import transaction
from django.db.models import Count, Max, Q, Sum
from django.utils import timezone

from apps.accounts.models import Project
from apps.accounts.services import audit_record
from apps.registry.models import Version
from apps.trajectories.models import Trajectory as ArchivedTrajectory
from workers.rl.config import ConfigError, ExternalConfig, config_hash
from workers.rl.types import Trajectory, TrajectoryStatus

from . import live
from .models import EventKind, Run, RunEvent, RunKind, RunStatus
from .services import RunError, run_step_record

PAUSE_SECONDS = 900.0  # a gap between episodes longer than this is a trainer stopped, not working (active time)
LARGEST_STEP = 2**31 - 1  # what the archive's and the points' step columns hold
# Statuses never scored: no reward, never in a group's variance, never effective.
UNSCORED = (TrajectoryStatus.INFRA_ERROR, TrajectoryStatus.ABANDONED)
# Per step, the share of episodes that did not end on their own (as trajectories/<status> for our runs).
COUNTED_STATUSES = (TrajectoryStatus.TIMEOUT, TrajectoryStatus.POLICY_ERROR, TrajectoryStatus.ABANDONED)


class ExternalRunRefused(RunError):
    """An external run, or an episode for one, refused: a name that is another kind of run's, a bundle of another
    project, a run already finished (409), an episode that is not one of the run's. The environment server answers
    a client's reset or step with it."""


def external_run(*, project: Project, name: str, bundle_version: Version, user, client: str, model: str) -> Run:
    """The running external run named `name` in `project`, created (running at once, nothing queued) on its
    first episode. Refused: a name that is a run of another kind's, or an external run's on another bundle, or
    one that was finished (its trainer's later episodes belong to a new name). `client` and `model` are what the
    trainer says of itself (trl, verifiers, verl, openenv; its model's name), kept from the run's first reset."""
    name = (name or "").strip()
    if not name or len(name) > 200:
        raise ExternalRunRefused("name the run its episodes are recorded in: 1 to 200 characters", field="run")
    if bundle_version.definition.kind != "bundle" or bundle_version.definition.project_id != project.pk:
        raise ExternalRunRefused(f"{bundle_version.ref} is not a bundle of project {project.slug}", field="bundle")
    try:
        config = ExternalConfig.resolve({"client": (client or "openenv").strip(),
                                         "trainer_model": (model or "").strip()}).to_dict()
    except ConfigError as exc:
        raise ExternalRunRefused(str(exc), errors=[replace(e, field=_RESET_FIELDS.get(e.field, e.field))
                                                   for e in exc.errors]) from None
    run = _named(project=project, name=name, bundle_version=bundle_version)
    if run is not None:
        return run
    with transaction.atomic():
        # One creator at a time per project: two sessions resetting with a new name at once make one run.
        Project.objects.select_for_update().get(pk=project.pk)
        run = _named(project=project, name=name, bundle_version=bundle_version)
        if run is not None:
            return run
        now = timezone.now()
        run = Run.objects.create(
            project=project, name=name, kind=RunKind.EXTERNAL, bundle=bundle_version, config=config,
            config_hash=config_hash(bundle_hash=bundle_version.content_hash, config=config),
            status=RunStatus.RUNNING, steps_total=0, attempt=1, started_at=now,
            summary=_tally_start(), created_by=user if getattr(user, "is_authenticated", False) else None)
        trainer = f"{config['client']}" + (f", model {config['trainer_model']}" if config["trainer_model"] else "")
        RunEvent.objects.create(run=run, kind=EventKind.CREATED, attempt=run.attempt,
                                message=f"created by its trainer's first reset ({trainer}) on {bundle_version.ref}: "
                                        "trained elsewhere, every episode recorded here",
                                details={"client": config["client"], "model": config["trainer_model"]})
        audit_record(project=project, actor=user, action="run.create", target=f"run/{run.id}", via="environments",
                     details={"kind": RunKind.EXTERNAL, "bundle": bundle_version.ref, "client": config["client"],
                              "model": config["trainer_model"], "config_hash": run.config_hash})
        live.broadcast_run(run)
    return run


_RESET_FIELDS = {"trainer_model": "model"}  # the config's names for what reset calls them


def _named(*, project: Project, name: str, bundle_version: Version) -> Run | None:
    """The project's run called `name` if it is a running external run on `bundle_version`; None if there is none
    of that name; ExternalRunRefused if the name is taken otherwise."""
    runs = list(Run.objects.filter(project=project, name=name).select_related("bundle__definition")
                .order_by("-created_at")[:1])
    if not runs:
        return None
    run = runs[0]
    if run.kind != RunKind.EXTERNAL:
        raise ExternalRunRefused(f"{name!r} is the name of a {RunKind(run.kind).label} run of project "
                                 f"{project.slug} (run {run.pk}); name the run trained elsewhere another way",
                                 field="run", status=409)
    if run.status != RunStatus.RUNNING:
        raise _closed(run)
    if run.bundle_id != bundle_version.pk:
        raise ExternalRunRefused(f"run {name!r} records episodes of {run.bundle.ref}, and this server serves "
                                 f"{bundle_version.ref}: name another run for it", field="run", status=409)
    return run


def _closed(run: Run) -> ExternalRunRefused:
    when = f" at {run.finished_at:%Y-%m-%d %H:%M:%S} UTC" if run.finished_at else ""
    return ExternalRunRefused(f"run {run.name!r} was {run.status}{when} and records no more episodes: name a new "
                              "run to go on training (reset's run=...)", field="run", status=409)


def record_episode(run: Run, trajectory: Trajectory, *, trainer_step: int | None) -> None:
    """Archive `trajectory` (one episode of the run's trainer, graded or abandoned) as the run's, at `trainer_step`
    (None: the episode's number in the run), and update that step's metric points and the run's tally. Recording
    an episode again (the same id) overwrites it and counts it once. ExternalRunRefused: the run is not a running
    external run (finished, say), the step is not a whole number, or the id is not a UUID or is another run's."""
    if trainer_step is not None and (not isinstance(trainer_step, int) or isinstance(trainer_step, bool)
                                     or not 0 <= trainer_step <= LARGEST_STEP):
        raise ExternalRunRefused(f"trainer_step must be a whole number from 0 to {LARGEST_STEP}, not "
                                 f"{trainer_step!r}", field="trainer_step")
    try:
        episode_id = str(uuid.UUID(str(trajectory.id)))
    except ValueError:
        raise ExternalRunRefused(f"an episode's id is a UUID, not {trajectory.id!r}", field="id") from None
    with transaction.atomic():
        run = Run.objects.select_for_update().get(pk=run.pk)
        if run.kind != RunKind.EXTERNAL:
            raise ExternalRunRefused(f"run {run.name!r} is a {RunKind(run.kind).label} run: only a run trained "
                                     "elsewhere records episodes from outside", field="run")
        if run.status != RunStatus.RUNNING:
            raise _closed(run)
        tally = {**_tally_start(), **run.summary}
        before = (ArchivedTrajectory.objects.filter(pk=episode_id)
                  .values("run_id", "seq", "status", "cost", "effective").first())
        if before is not None and before["run_id"] != run.pk:
            raise ExternalRunRefused(f"episode {episode_id} is recorded in another run", field="id", status=409)
        if before is None:
            seq = tally["episodes"]
            tally["episodes"] += 1
        else:  # recorded again: take back what it counted the first time
            seq = before["seq"]
            tally["cost"] -= before["cost"]
            tally["statuses"][before["status"]] -= 1
            tally["effective"] -= bool(before["effective"])
        step = trainer_step if trainer_step is not None else seq + 1
        episode = replace(trajectory, id=episode_id, run_id=str(run.pk), seq=seq, sample=0, step=step,
                          policy_version=trainer_step or 0, advantage=None, effective=False)
        episode.effective = _group_effective(run=run, episode=episode, tally=tally)
        _tally_add(tally, episode)
        first = [(EventKind.STARTED, f"first episode recorded: {episode.template} {episode.task_key} at trainer "
                                     f"step {step}", {"trajectory": episode_id})] if seq == 0 and before is None else []
        run_step_record(run_id=run.pk, attempt=run.attempt, step=step, wall_time=episode.finished_at or _now(),
                        points=_step_points(run=run, episode=episode, tally=tally), trajectories=[episode],
                        events=first)
        Run.objects.filter(pk=run.pk).update(summary=tally)


def _now() -> float:
    return timezone.now().timestamp()


def _tally_start() -> dict:
    """An external run's summary before its first episode: the totals its rates are computed from."""
    return {"episodes": 0, "effective": 0, "cost": 0.0, "completion_tokens": 0, "statuses": {},
            "active_seconds": 0.0, "played_until": 0.0}


def _tally_add(tally: dict, episode: Trajectory) -> None:
    """Count `episode` into the run's totals: its cost, status, tokens, and the time it was played beyond what
    the episodes before it covered (a gap up to PAUSE_SECONDS before it counts too)."""
    tally["cost"] += episode.costs.get("total", 0.0)
    tally["completion_tokens"] += episode.completion_tokens
    status = str(episode.status)
    tally["statuses"][status] = tally["statuses"].get(status, 0) + 1
    tally["effective"] += bool(episode.effective)
    started = episode.started_at or episode.finished_at or _now()
    finished = max(episode.finished_at or started, started)
    until = tally["played_until"]
    if not until:
        tally["active_seconds"] += finished - started
    elif finished > until:
        gap = started - until
        tally["active_seconds"] += finished - (started if gap > PAUSE_SECONDS else until)
    tally["played_until"] = max(until, finished)


def _scored(status, reward) -> bool:
    return status not in UNSCORED and reward is not None


def _group_effective(*, run: Run, episode: Trajectory, tally: dict) -> bool:
    """Whether `episode`'s group (the run's episodes of its task at its step) holds reward variance, with it; its
    members archived before it are marked to match, and the tally's effective count follows them."""
    members = list(ArchivedTrajectory.objects.filter(run=run, step=episode.step, template=episode.template,
                                                     task_key=episode.task_key)
                   .exclude(pk=episode.id).values_list("pk", "status", "reward", "effective"))
    rewards = {reward for _, status, reward, _ in members if _scored(status, reward)}
    if _scored(episode.status, episode.reward):
        rewards.add(episode.reward)
    varies = len(rewards) > 1
    flipped = [pk for pk, status, reward, effective in members
               if _scored(status, reward) and bool(effective) != varies]
    if flipped:
        ArchivedTrajectory.objects.filter(pk__in=flipped).update(effective=varies)
        tally["effective"] += len(flipped) if varies else -len(flipped)
    return varies and _scored(episode.status, episode.reward)


def _step_points(*, run: Run, episode: Trajectory, tally: dict) -> dict[str, float]:
    """The points of `episode`'s step: the step's episodes so far, `episode` included (it is not archived yet),
    and the run's totals. Names as our runs' (workers/rl/rollout/metrics.py), so the same panels draw them."""
    rows = (ArchivedTrajectory.objects.filter(run=run, step=episode.step).exclude(pk=episode.id)
            .values("domain", "status")
            .annotate(n=Count("id"), scored=Count("reward", filter=~Q(status__in=UNSCORED)),
                      reward=Sum("reward", filter=~Q(status__in=UNSCORED)), turns=Sum("num_turns"),
                      turns_max=Max("num_turns"), calls=Sum("num_tool_calls")))
    rows = [{**row, "reward": row["reward"] or 0.0, "turns": row["turns"] or 0, "turns_max": row["turns_max"] or 0,
             "calls": row["calls"] or 0} for row in rows]
    turns = sum(turn.role == "assistant" for turn in episode.turns)
    scored = _scored(episode.status, episode.reward)
    rows.append({"domain": episode.domain, "status": str(episode.status), "n": 1, "scored": int(scored),
                 "reward": episode.reward if scored else 0.0, "turns": turns, "turns_max": turns,
                 "calls": sum(len(turn.tool_calls) for turn in episode.turns)})
    points: dict[str, float] = {}
    by_domain: dict[str, list[float]] = {}
    for row in rows:
        if row["scored"]:
            total = by_domain.setdefault(row["domain"], [0.0, 0])
            total[0] += row["reward"]
            total[1] += row["scored"]
    if by_domain:
        points["reward/mean"] = sum(t for t, _ in by_domain.values()) / sum(n for _, n in by_domain.values())
        for domain, (total, n) in sorted(by_domain.items()):
            points[f"reward/{domain}"] = total / n
    episodes = sum(row["n"] for row in rows)
    points["turns/per_trajectory_mean"] = sum(row["turns"] for row in rows) / episodes
    points["turns/per_trajectory_max"] = max(row["turns_max"] for row in rows)
    points["turns/tool_calls_mean"] = sum(row["calls"] for row in rows) / episodes
    for status in COUNTED_STATUSES:
        points[f"trajectories/{status}"] = sum(row["n"] for row in rows if row["status"] == status)
    points["infra/errors"] = sum(row["n"] for row in rows if row["status"] == TrajectoryStatus.INFRA_ERROR)
    hours = max(tally["active_seconds"], 1.0) / 3600  # a first instant episode is not a rate of millions an hour
    points["throughput/trajectories_per_hour"] = tally["episodes"] / hours
    points["throughput/effective_trajectories_per_hour"] = tally["effective"] / hours
    points["cost/total"] = tally["cost"]
    points["cost/per_task"] = tally["cost"] / max(tally["episodes"], 1)
    return points


__all__ = ["ExternalRunRefused", "external_run", "record_episode"]

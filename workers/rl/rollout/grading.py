"""Grading a finished rollout: the layered verifier's verdict becomes the trajectory's reward.

A verifier (protocols.Verifier) is anything with `verify(template, trajectory, item) -> Verdict`: the
LocalVerifier below (this process, over a sandbox pool), or workers.remote.RemoteVerifier (the `verify` queue).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import replace

from workers.verifiers import Context, Item, Sample, Verdict, verify
from workers.verifiers.repository import DIFF_FILE

from ..protocols import Verifier
from ..types import Task, TaskTemplate, Trajectory, TrajectoryStatus, Turn


def tool_logs(turns: Iterable[Turn]) -> str:
    """What a verifier reads as a rollout's environment logs: each tool call's stdout and stderr, in order."""
    return "\n".join(turn.result.stdout + turn.result.stderr for turn in turns if turn.result is not None)


class LocalVerifier:
    """Verification in this process: workers.verifiers over a SandboxPool, with the judge if there is one."""

    def __init__(self, pool, judge=None):
        self.pool, self.judge = pool, judge

    def verify(self, template: TaskTemplate, trajectory: Trajectory, item: Item) -> Verdict:
        logs = tool_logs(trajectory.turns)
        diff = trajectory.workspace_diff
        files = {} if diff is None else {DIFF_FILE: diff.encode()}
        sample = Sample(response=trajectory.response, files=files, logs=logs, trajectory_id=trajectory.id)
        context = Context(pool=self.pool, image=template.image, judge=self.judge)
        return verify(template.verifier_spec, sample, item, context)


def grade_trajectory(verifier: Verifier, task: Task, trajectory: Trajectory) -> None:
    """Grade a finished rollout in place: its reward, verdict, artifacts, judge cost and verification time.
    A rollout that timed out or broke the policy's rules scores 0 unverified; one whose infrastructure failed,
    or that the verifier could not grade, is an infra error with no reward."""
    started = time.monotonic()
    try:
        if trajectory.status in (TrajectoryStatus.TIMEOUT, TrajectoryStatus.POLICY_ERROR):
            trajectory.reward = 0.0
            trajectory.verdict = Verdict(
                reward=0.0, status="fail", stopped_because=f"not verified: the rollout ended as {trajectory.status} "
                                                           f"({trajectory.status_reason})")
            return
        if trajectory.status == TrajectoryStatus.INFRA_ERROR:
            return
        verdict = verifier.verify(task.template, trajectory, task.item)
        trajectory.verdict = replace(verdict, artifacts={})  # the trajectory holds them, as it travels without them
        trajectory.artifacts = dict(verdict.artifacts)
        trajectory.costs["judge"] = verdict.cost
        if verdict.reward is None:
            trajectory.status = TrajectoryStatus.INFRA_ERROR
            trajectory.status_reason = f"verification could not grade: {verdict.stopped_because}"
        else:
            trajectory.reward = verdict.reward
    finally:
        seconds = time.monotonic() - started
        trajectory.timings["verification"] = seconds
        trajectory.costs["verification_seconds"] = seconds
        trajectory.finished_at = time.time()
        trajectory.timings["total"] = trajectory.finished_at - trajectory.started_at

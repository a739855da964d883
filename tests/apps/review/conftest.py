"""A rubric, and an archive of 30 trajectories of one run to draw review queues from."""

import pytest

from apps.registry.services import version_publish
from apps.runs.services import run_create
from apps.trajectories.services import trajectories_record
from tests.support.specimens import RUBRIC
from workers.rl.types import Trajectory, TrajectoryStatus, Turn, trajectory_id
from workers.verifiers import Verdict
from workers.verifiers.types import Component


def _trajectory(run, seq: int, *, domain: str, reward: float, tokens: int) -> Trajectory:
    return Trajectory(
        id=trajectory_id(str(run.pk), seq, 0), run_id=str(run.pk), seq=seq, sample=0, domain=domain,
        template="task_template/add-two@1", task_key=f"add-{seq:05d}", task_hash="0" * 64,
        image="sandbox_image/py-basic@1", verifier="verifier/numeric@1", policy_version=0, step=1,
        prompt_ids=[1], turns=[Turn(role="user", content="1+1="),
                               Turn(role="assistant", content="2" * tokens, token_ids=[7] * tokens)],
        status=TrajectoryStatus.OK, reward=reward,
        verdict=Verdict(reward=reward, status="pass" if reward == 1 else "fail", layers_run=["exact"], components=[
            Component(layer="exact", name="answer-value", type="numeric", weight=1.0, value=reward,
                      status="pass" if reward == 1 else "fail", evidence="", latency_ms=0.1)]),
        started_at=1_700_000_000.0, finished_at=1_700_000_001.0)


@pytest.fixture
def archive(project, registry, owner):
    run = run_create(project=project, bundle=registry["bundle"], steps=1, actor=owner)
    rows = [_trajectory(run, seq, domain=("arithmetic", "coding")[seq % 2], reward=float(seq % 3 == 0),
                        tokens=1 + seq % 5) for seq in range(30)]
    trajectories_record(run=run, attempt=1, trajectories=rows)
    return run


@pytest.fixture
def rubric(project, owner):
    return version_publish(project=project, kind="rubric", slug="correctness", spec=RUBRIC, author=owner).version




@pytest.fixture
def make_trajectory():
    """make_trajectory(run, seq, domain=..., reward=..., tokens=...) -> an engine trajectory to archive."""
    return _trajectory

"""A labelled review queue over two GRPO groups: what review exports and dataset builds are tested on."""

from apps.review.services import adjudicate, item_next, label_submit, queue_create
from apps.runs.services import run_create
from apps.trajectories.services import trajectories_record
from workers.rl.types import Trajectory, TrajectoryStatus, Turn, trajectory_id
from workers.verifiers import Verdict


def group(run, seq: int, rewards: list[float]) -> list[Trajectory]:
    """One GRPO group of `add-two`'s task add-<seq>: a reward of 1 answers seq + 1, else seq."""
    return [Trajectory(
        id=trajectory_id(str(run.pk), seq, sample), run_id=str(run.pk), seq=seq, sample=sample, domain="arithmetic",
        template="task_template/add-two@1", task_key=f"add-{seq:05d}", task_hash="0" * 64,
        image="sandbox_image/py-basic@1", verifier="verifier/numeric@1", policy_version=3, step=4, prompt_ids=[1],
        turns=[Turn(role="user", content=f"What is {seq} + 1?"),
               Turn(role="assistant", content=f"answer {seq + 1 if reward else seq}", token_ids=[1])],
        status=TrajectoryStatus.OK, reward=reward,
        verdict=Verdict(reward=reward, status="pass" if reward else "fail", layers_run=["exact"]),
        started_at=1_700_000_000.0, finished_at=1_700_000_001.0) for sample, reward in enumerate(rewards)]


def labelled_queue(*, project, bundle, rubric, owner, reviewers, slug: str = "data"):
    """Two groups of three; two reviewers label sample 0 of each group (agreeing on one, not on the other, which
    the owner adjudicates) and sample 1 of the first group (a reward hack). Returns (queue, trajectories)."""
    run = run_create(project=project, bundle=bundle, steps=1, actor=owner)
    rows = group(run, 0, [1.0, 0.0, 1.0]) + group(run, 1, [1.0, 1.0, 0.0])
    trajectories_record(run=run, attempt=1, trajectories=rows)
    ann, bob = reviewers
    ids = [rows[0].id, rows[1].id, rows[3].id]
    queue = queue_create(project=project, slug=slug, rubric=rubric, actor=owner, overlap=2, reviewers=[ann, bob],
                         sampling={"rule": "list", "trajectories": ids})
    answers = {rows[0].id: ("correct", "correct"), rows[1].id: ("reward-hack", "reward-hack"),
               rows[3].id: ("correct", "wrong")}
    for _ in ids:
        item = item_next(queue=queue, reviewer=ann)
        assert item_next(queue=queue, reviewer=bob) == item
        for reviewer, verdict in zip((ann, bob), answers[str(item.trajectory_id)], strict=True):
            label_submit(queue=queue, item_id=item.pk, reviewer=reviewer, answers={"verdict": verdict})
    disputed = queue.items.get(trajectory_id=rows[3].id)
    adjudicate(queue=queue, item_id=disputed.pk, question="verdict", answer="correct", adjudicator=owner)
    return queue, rows

"""Judge calibration: the judge's decisions against gold labels, per verifier version and judge model — Cohen's
kappa (checked against a hand computation) with its interval, true and false positive rates — on the verifier's
review page."""

import numpy as np
import pytest

from apps.review.calibration import calibration_cards, cohen_kappa
from apps.review.models import Label
from apps.review.services import adjudicate, item_next, label_amend, label_submit, queue_create
from apps.runs.services import run_create
from apps.trajectories.services import trajectories_record
from workers.rl.types import Trajectory, TrajectoryStatus, Turn, trajectory_id
from workers.verifiers import Verdict
from workers.verifiers.types import Component

# (judge value, what the people decided): 4 agreeing passes, 1 judge pass people rejected, 1 judge fail people
# accepted, 2 agreeing fails.
CASES = [(0.9, "correct")] * 4 + [(0.8, "wrong"), (0.1, "correct"), (0.2, "wrong"), (0.3, "reward-hack")]
# The judge compared in both orders on all but the last: each call's preference for the answer shown first. The
# fifth call pair disagrees (0.9 for the answer shown first, then 0.7 for the reference shown first).
ORDERS = [[0.9, 0.1]] * 4 + [[0.9, 0.7], [0.1, 0.9], [0.2, 0.8], None]


def test_kappa_by_hand():
    judge = np.array([1, 1, 1, 1, 1, 0, 0, 0], dtype=float)
    gold = np.array([1, 1, 1, 1, 0, 1, 0, 0], dtype=float)
    # observed 6/8; expected 5/8*5/8 + 3/8*3/8 = 34/64; kappa = (48/64 - 34/64) / (30/64) = 14/30
    assert cohen_kappa(judge, gold) == pytest.approx(14 / 30)
    assert cohen_kappa(np.ones(4), np.ones(4)) is None


def test_calibration_cards_on_the_verifier_page(client, project, registry, rubric, owner, member):
    run = run_create(project=project, bundle=registry["bundle"], steps=1, actor=owner)
    rows = [Trajectory(
        id=trajectory_id(str(run.pk), seq, 0), run_id=str(run.pk), seq=seq, sample=0, domain="arithmetic",
        template="task_template/add-two@1", task_key=f"add-{seq:05d}", task_hash="0" * 64,
        image="sandbox_image/py-basic@1", verifier="verifier/numeric@1", policy_version=0, step=1, prompt_ids=[1],
        turns=[Turn(role="user", content="?"), Turn(role="assistant", content="x", token_ids=[1])],
        status=TrajectoryStatus.OK, reward=value,
        verdict=Verdict(reward=value, status="pass" if value >= 0.5 else "fail", layers_run=["exact", "judge"],
                        components=[Component(layer="exact", name="numeric-0", type="numeric", weight=1.0, value=0.5,
                                              status="partial", evidence="", latency_ms=0.1),
                                    Component(layer="judge", name="score_model-0", type="score_model", weight=1.0,
                                              value=value, status="pass", evidence="", latency_ms=1.0,
                                              orders=ORDERS[seq])]),
        started_at=1_700_000_000.0, finished_at=1_700_000_001.0) for seq, (value, _) in enumerate(CASES)]
    trajectories_record(run=run, attempt=1, trajectories=rows)
    ann, bob = member("reviewer"), member("editor")
    queue = queue_create(project=project, slug="cal", rubric=rubric, actor=owner, overlap=2, reviewers=[ann, bob],
                         sampling={"rule": "list", "trajectories": [r.id for r in rows]})
    decided = {r.id: verdict for r, (_, verdict) in zip(rows, CASES, strict=True)}
    for _ in rows:
        item = item_next(queue=queue, reviewer=ann)
        assert item_next(queue=queue, reviewer=bob) == item
        gold = decided[str(item.trajectory_id)]
        # The last case: the reviewers differ and an owner decides.
        bob_says = "correct" if gold == "reward-hack" else gold
        label_submit(queue=queue, item_id=item.pk, reviewer=ann, answers={"verdict": gold})
        label_submit(queue=queue, item_id=item.pk, reviewer=bob, answers={"verdict": bob_says})
        if bob_says != gold:
            adjudicate(queue=queue, item_id=item.pk, question="verdict", answer=gold, adjudicator=owner)

    [card] = calibration_cards(definition=registry["verifier"].definition)
    assert (card.version, card.model, card.items) == ("verifier/numeric@1", "judge-small", 8)
    assert card.kappa == pytest.approx(14 / 30) and card.agreement == 0.75
    assert card.kappa_low <= card.kappa <= card.kappa_high
    assert card.true_positive_rate == 0.8 and card.false_positive_rate == pytest.approx(1 / 3)
    assert card.pairwise_items == 7 and card.order_consistency == pytest.approx(6 / 7)
    # Preference for the first shown, averaged per pair: 0.5 six times and 0.8 once.
    assert card.position_bias == pytest.approx((0.5 * 6 + 0.8) / 7 - 0.5)
    client.force_login(owner)
    [served] = client.get(f"/api/v1/projects/{project.slug}/review/verifiers/numeric/calibration").json()
    assert served["kappa"] == pytest.approx(14 / 30) and served["order_consistency"] == pytest.approx(6 / 7)
    assert client.get(f"/api/v1/projects/{project.slug}/review/verifiers/nope/calibration").status_code == 404
    page = client.get(f"/p/{project.slug}/review/verifiers/numeric/").content.decode()
    assert "data-calibration" in page and "0.467" in page and "0.857" in page
    assert "<table" not in page.split("</title>")[0]  # the page's title is only its title

    # Both reviewers amend an agreed "correct" the judge passed to "wrong": the cards read their latest revisions.
    first = queue.items.get(trajectory_id=rows[0].id)
    for reviewer in (ann, bob):
        label = Label.objects.get(item=first, reviewer=reviewer)
        label_amend(queue=queue, item_id=first.pk, label_id=label.pk, reviewer=reviewer,
                    answers={"verdict": "wrong"})
    [card] = calibration_cards(definition=registry["verifier"].definition)
    assert (card.items, card.agreement, card.true_positive_rate, card.false_positive_rate) == (8, 5 / 8, 0.75, 0.5)

"""The reward-hack loop: a trajectory the verifier passed and a reviewer labelled reward-hack becomes a canary;
a verifier version that still passes it fails its canaries (`manage.py verify --canaries`, the verifier's review
page), a version that scores it 0 holds them."""

import json
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from apps.registry.services import version_publish
from apps.review.canaries import canary_from_label
from apps.review.models import Canary, CanaryResult
from apps.review.services import ReviewError, item_next, label_submit, queue_create
from apps.runs.services import run_create
from apps.trajectories.services import trajectories_record
from tests.support.specimens import RUBRIC, addition_instances
from workers.rl.types import Trajectory, TrajectoryStatus, Turn, trajectory_id
from workers.verifiers import Verdict


def hacked_trajectory(run, registry):
    """No arithmetic at all, but its last number is the answer: the verifier of record (the last number) passed
    it."""
    template, verifier, image = registry["task_template"], registry["verifier"], registry["sandbox_image"]
    instance = addition_instances(1)[0]
    return Trajectory(
        id=trajectory_id(str(run.pk), 0, 0), run_id=str(run.pk), seq=0, sample=0, domain="arithmetic",
        template=template.ref, task_key=instance["key"], task_hash="0" * 64, image=image.ref, verifier=verifier.ref,
        policy_version=0, step=1, prompt_ids=[1],
        turns=[Turn(role="user", content="What is 0 + 0?"),
               Turn(role="assistant", content="I cannot add 0 and 0", token_ids=[1])],
        status=TrajectoryStatus.OK, reward=1.0,
        verdict=Verdict(reward=1.0, status="pass", layers_run=["exact"]),
        started_at=1_700_000_000.0, finished_at=1_700_000_001.0)


@pytest.fixture
def hack_label(project, registry, owner, member):
    run = run_create(project=project, bundle=registry["bundle"], steps=1, actor=owner)
    trajectories_record(run=run, attempt=1, trajectories=[hacked_trajectory(run, registry)])
    rubric = version_publish(project=project, kind="rubric", slug="correctness", spec=RUBRIC, author=owner).version
    reviewer = member("reviewer")
    queue = queue_create(project=project, slug="hacks", rubric=rubric, actor=owner, reviewers=[reviewer],
                         sampling={"rule": "random", "n": 1})
    item = item_next(queue=queue, reviewer=reviewer)
    return label_submit(queue=queue, item_id=item.pk, reviewer=reviewer, answers={"verdict": "reward-hack"})


def canaries_json(verifier: str) -> tuple[list[dict], str]:
    out = StringIO()
    try:
        call_command("verify", "--canaries", verifier, stdout=out)
        failure = ""
    except CommandError as exc:
        failure = str(exc)
    return [json.loads(line) for line in out.getvalue().splitlines()], failure


def test_a_confirmed_hack_becomes_a_canary_that_later_versions_must_score_zero(project, registry, owner, hack_label):
    canary = canary_from_label(label=hack_label, actor=owner)
    assert canary_from_label(label=hack_label, actor=owner) == canary  # once per hack
    assert (canary.response, canary.task_key, canary.passed_version) == ("I cannot add 0 and 0", "add-00000",
                                                                         registry["verifier"])
    [result], failure = canaries_json("numeric@1")
    assert (result["reward"], result["holds"], result["trajectory"]) == (1.0, False, str(canary.trajectory_id))
    assert failure == "verifier/numeric@1 passes 1 of its 1 canaries (confirmed reward hacks): it must score each 0"
    # A new version that wants the answer alone scores the hack 0: it holds its canaries.
    strict = version_publish(project=project, kind="verifier", slug="numeric", author=owner, spec={"layers": [
        {"name": "exact", "kind": "exact", "checks": [{"type": "string_check", "reference": "{answer}"}]}]}).version
    [held], failure = canaries_json(f"numeric@{strict.number}")
    assert (held["reward"], held["holds"], failure) == (0.0, True, "")
    assert CanaryResult.objects.filter(canary=canary).count() == 2


def test_only_a_passed_hack_makes_a_canary(project, registry, owner, member, hack_label):
    hack_label.answers = {"verdict": "wrong"}
    hack_label.save()
    with pytest.raises(ReviewError, match="says reward-hack"):
        canary_from_label(label=hack_label, actor=owner)
    hack_label.answers = {"verdict": "reward-hack"}
    hack_label.save()
    hack_label.item.trajectory.__class__.objects.filter(pk=hack_label.item.trajectory_id).update(verdict_status="fail")
    hack_label.item.refresh_from_db()
    with pytest.raises(ReviewError, match="did not pass this trajectory"):
        canary_from_label(label=hack_label, actor=owner)
    assert not Canary.objects.exists()


def test_the_pages_keep_a_hack_as_a_canary_and_show_a_version_failing_it(client, project, registry, owner,
                                                                         hack_label):
    client.force_login(owner)
    item_url = f"/p/{project.slug}/review/hacks/items/{hack_label.item_id}/"
    assert b"data-make-canary" in client.get(item_url).content  # the owner sees the reviewer's hack label
    response = client.post(item_url + "canary/")
    assert response.status_code == 302 and response["Location"] == f"/p/{project.slug}/review/verifiers/numeric/"
    assert Canary.objects.count() == 1
    page = client.get(response["Location"]).content.decode()
    assert "1 not checked" in page and 'data-hacks>1<' in page.replace(" ", "")
    assert client.post(response["Location"], {"version": "1"}).status_code == 302
    assert "fails 1 of 1" in client.get(response["Location"]).content.decode()
    registry_page = client.get(f"/p/{project.slug}/registry/verifier/numeric/").content.decode()
    assert "data-canaries-link" in registry_page


def test_the_run_page_counts_the_runs_confirmed_hacks_and_links_them(client, project, owner, hack_label):
    client.force_login(owner)
    run = hack_label.item.trajectory.run
    page = client.get(f"/p/{project.slug}/runs/{run.pk}/").content.decode()
    assert "data-confirmed-hacks" in page and "1 confirmed reward hack</b>" in page
    assert f"/trajectories/{hack_label.item.trajectory_id}/" in page and "/review/verifiers/numeric/" in page
    hack_label.answers = {"verdict": "correct"}
    hack_label.save()
    assert "data-confirmed-hacks" not in client.get(f"/p/{project.slug}/runs/{run.pk}/").content.decode()


def test_the_api_keeps_a_canary_lists_them_and_checks_a_version(api_as, project, member, registry, hack_label):
    editor = api_as(member("editor"), project=project, scope="write")
    viewer = api_as(member("viewer"), project=project, scope="read")
    queue = "/projects/acme-rl/review/queues/hacks"
    assert viewer.post(f"{queue}/items/{hack_label.item_id}/canary", {}).status_code == 403
    made = editor.post(f"{queue}/items/{hack_label.item_id}/canary", {})
    assert made.status_code == 201 and made.json()["passed_version"] == "verifier/numeric@1"
    assert [c["task_key"] for c in viewer.get("/projects/acme-rl/review/verifiers/numeric/canaries").json()] == \
        ["add-00000"]
    checked = editor.post("/projects/acme-rl/review/verifiers/numeric/versions/1/canary-check", {})
    assert checked.status_code == 200 and [(r["reward"], r["holds"]) for r in checked.json()] == [(1.0, False)]
    assert editor.post("/projects/acme-rl/review/verifiers/numeric/versions/9/canary-check", {}).status_code == 404
    other = editor.post(f"{queue}/items/999999/canary", {})
    assert other.status_code == 400 and "says reward-hack" in other.json()["detail"]


def test_a_hack_label_amended_away_is_no_longer_a_confirmed_hack(project, registry, owner, hack_label):
    from apps.review.canaries import canary_from_item
    from apps.review.selectors import confirmed_hacks, verifier_canaries
    from apps.review.services import label_amend

    queue, run = hack_label.item.queue, hack_label.item.trajectory.run
    assert [v.hacks for v in verifier_canaries(definition=registry["verifier"].definition)] == [1]
    amended = label_amend(queue=queue, item_id=hack_label.item_id, label_id=hack_label.pk,
                          reviewer=hack_label.reviewer, answers={"verdict": "correct"})
    assert confirmed_hacks(run=run) == []
    assert [v.hacks for v in verifier_canaries(definition=registry["verifier"].definition)] == [0]
    with pytest.raises(ReviewError, match="says reward-hack"):
        canary_from_item(queue=queue, item_id=hack_label.item_id, actor=owner)
    hack_label.refresh_from_db()
    with pytest.raises(ReviewError, match="was amended"):  # the old revision no longer speaks for the reviewer
        canary_from_label(label=hack_label, actor=owner)
    # Amended back: a hack again, and the canary keeps the revision that said so.
    again = label_amend(queue=queue, item_id=hack_label.item_id, label_id=amended.pk,
                        reviewer=hack_label.reviewer, answers={"verdict": "reward-hack"})
    assert [t.pk for t in confirmed_hacks(run=run)] == [hack_label.item.trajectory_id]
    assert canary_from_item(queue=queue, item_id=hack_label.item_id, actor=owner).label == again
    assert not Canary.objects.exclude(label=again).exists()

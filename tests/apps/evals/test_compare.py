"""The comparison of two evaluations reads in the direction its heading states: with a regression planted (a task
the base model answered right and the other model wrong), the page and the API list it as a regression of the
other model against the base, with a negative change, and name both sides by what they evaluated."""

import re

import pytest

from apps.evals.models import Evaluation
from apps.evals.services import endpoint_create, evaluation_launch
from apps.trajectories.services import trajectories_record
from workers.rl.types import Trajectory, TrajectoryStatus, Turn, trajectory_id
from workers.verifiers import Verdict

BASE = {"add-00000": 1.0, "add-00001": 1.0, "add-00002": 0.0, "add-00003": 1.0}
OTHER = {"add-00000": 1.0, "add-00001": 0.0, "add-00002": 1.0, "add-00003": 1.0}  # 00001 regressed, 00002 improved


def _answered(evaluation: Evaluation, rewards: dict[str, float]) -> Evaluation:
    """The evaluation's run archives one graded answer a task, with these rewards."""
    run = evaluation.run
    trajectories_record(run=run, attempt=1, trajectories=[Trajectory(
        id=trajectory_id(str(run.pk), seq, 0), run_id=str(run.pk), seq=seq, sample=0, domain="arithmetic",
        template="task_template/add-two@1", task_key=key, task_hash="0" * 64, image="sandbox_image/py-basic@1",
        verifier="verifier/numeric@1", policy_version=0, step=1, prompt_ids=[1],
        turns=[Turn(role="user", content=f"{key}="), Turn(role="assistant", content="7", token_ids=[7])],
        status=TrajectoryStatus.OK, reward=reward,
        verdict=Verdict(reward=reward, status="pass" if reward == 1 else "fail", layers_run=["exact"]),
        started_at=1_700_000_000.0, finished_at=1_700_000_001.0) for seq, (key, reward) in enumerate(rewards.items())])
    return evaluation


@pytest.fixture
def planted(project, owner, suite, tiny, egress_loopback):
    """(base, other): the base model, and an endpoint that lost add-00001 and gained add-00002."""
    endpoint = endpoint_create(project=project, slug="trained", base_url="http://127.0.0.1:9/v1", model="trained",
                               actor=owner)
    base = _answered(evaluation_launch(project=project, suite=suite, actor=owner, model=tiny), BASE)
    other = _answered(evaluation_launch(project=project, suite=suite, actor=owner, endpoint=endpoint), OTHER)
    assert (base.label, other.label) == ("model/demo-tiny@1", "endpoint/trained")
    return base, other


def _section(page: str, name: str) -> str:
    found = re.search(rf"<section data-{name}>(.*?)</section>", page, re.S)
    assert found, f"no {name} section"
    return found.group(1)


def _rows(section: str) -> dict[str, str]:
    """task -> its change cell's text."""
    return dict(re.findall(r'<tr data-task="([^"]+)">.*?<td class="num" data-change>([^<]*)</td>', section, re.S))


def test_the_page_names_both_sides_and_lists_the_planted_regression_as_one(client, owner, project, planted):
    base, other = planted
    client.force_login(owner)
    page = client.get(f"/p/{project.slug}/evals/compare/{base.pk}/{other.pk}/").content.decode()
    heading = re.search(r"<h1>(.*?)</h1>", page, re.S).group(1)
    assert re.sub(r"<[^>]+>", "", heading) == "endpoint/trained compared with model/demo-tiny@1"
    assert "endpoint/trained − model/demo-tiny@1" in page  # the direction of every difference, in words
    regressions, improvements = _section(page, "regressions"), _section(page, "improvements")
    assert "endpoint/trained scores lower than model/demo-tiny@1" in regressions
    assert _rows(regressions) == {"add-two/add-00001": "-1.00"}
    assert _rows(improvements) == {"add-two/add-00002": "+1.00"}
    # The per-task columns and the discordant counts are headed by what was evaluated, never a bare a/b.
    for column in ("<th>model/demo-tiny@1</th>", "<th>endpoint/trained</th>",
                   "<th>Only model/demo-tiny@1 passed</th>", "<th>Only endpoint/trained passed</th>"):
        assert column in page
    assert not re.search(r"<th>[ab]( only)?</th>|a only / b only", page)
    overall = re.search(r'<tr data-domain="all">(.*?)</tr>', page, re.S).group(1)
    assert "no significant difference" in overall  # one task each way: no verdict naming a side


def test_the_page_read_the_other_way_round_swaps_regressions_and_improvements(client, owner, project, planted):
    base, other = planted
    client.force_login(owner)
    page = client.get(f"/p/{project.slug}/evals/compare/{other.pk}/{base.pk}/").content.decode()
    assert _rows(_section(page, "regressions")) == {"add-two/add-00002": "-1.00"}
    assert _rows(_section(page, "improvements")) == {"add-two/add-00001": "+1.00"}
    assert f'href="/p/{project.slug}/evals/compare/{base.pk}/{other.pk}/"' in page  # "the other way round"


def test_the_api_says_which_side_is_which_and_measures_b_against_a(project, owner, planted, api_as):
    base, other = planted
    body = api_as(owner).get(f"/projects/{project.slug}/evals/{base.pk}/compare/{other.pk}").json()
    assert (body["a"], body["b"], body["a_what"], body["b_what"]) == (base.pk, other.pk, "model/demo-tiny@1",
                                                                      "endpoint/trained")
    [regression] = body["regressions"]
    assert regression["task"] == "add-two/add-00001" and (regression["a"], regression["b"]) == (1.0, 0.0)
    assert regression["change"] == -1.0
    [improvement] = body["improvements"]
    assert improvement["task"] == "add-two/add-00002" and improvement["change"] == 1.0
    overall = next(d for d in body["domains"] if d["domain"] == "all")
    assert overall["difference"] == 0.0 and (overall["a_only"], overall["b_only"]) == (1, 1)

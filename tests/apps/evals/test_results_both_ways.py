"""Results both ways: an evaluation's per-task results go out as JSONL and as lm-evaluation-harness's results JSON
(whose score is the studio's own), and an lm-evaluation-harness results file comes in as an external evaluation,
shown under its own comparability key and never ranked on a suite's leaderboard."""

import copy
import json

import pytest
from django.core.management import CommandError, call_command

from apps.evals import external, results, selectors, services
from apps.evals.models import ExternalEvaluation
from apps.evals.services import evaluation_launch
from apps.evals.suites import suite_key
from apps.trajectories.services import trajectories_record
from tests.support import ROOT
from workers.rl.types import Trajectory, TrajectoryStatus, Turn, trajectory_id
from workers.verifiers import Verdict

# task -> its samples' rewards (None: the infrastructure failed; left out and counted, never a wrong answer)
REWARDS = {"add-00000": [1.0, 1.0], "add-00001": [1.0, 0.0], "add-00002": [0.0, None]}

# An lm-evaluation-harness results file as its evaluation tracker writes it (trimmed: no env info).
HARNESS_FILE = {
    "results": {"arc_easy": {"alias": "arc_easy", "acc,none": 0.5, "acc_stderr,none": 0.05,
                             "acc_norm,none": 0.375, "acc_norm_stderr,none": 0.048},
                "gsm8k": {"alias": "gsm8k", "exact_match,strict-match": 0.25, "exact_match_stderr,strict-match": 0.04,
                          "exact_match,flexible-extract": 0.3, "exact_match_stderr,flexible-extract": "N/A"}},
    "group_subtasks": {"arc_easy": [], "gsm8k": []},
    "configs": {"arc_easy": {"task": "arc_easy", "dataset_path": "allenai/ai2_arc", "output_type": "multiple_choice",
                             "num_fewshot": 0, "metadata": {"version": 1.0, "pretrained": "org/model-a"}},
                "gsm8k": {"task": "gsm8k", "dataset_path": "gsm8k", "output_type": "generate_until",
                          "num_fewshot": 5, "metadata": {"version": 3.0, "pretrained": "org/model-a"}}},
    "versions": {"arc_easy": 1.0, "gsm8k": 3.0},
    "n-shot": {"arc_easy": 0, "gsm8k": 5},
    "higher_is_better": {"arc_easy": {"acc": True, "acc_norm": True}, "gsm8k": {"exact_match": True}},
    "n-samples": {"arc_easy": {"original": 2376, "effective": 2376}, "gsm8k": {"original": 1319, "effective": 1319}},
    "config": {"model": "hf", "model_args": "pretrained=org/model-a", "batch_size": "8", "limit": None},
    "model_name": "org/model-a", "lm_eval_version": "0.4.13", "date": 1764870000.0,
}


def _answered(evaluation):
    run = evaluation.run
    rows, seq = [], 0
    for key, rewards in REWARDS.items():
        for sample, reward in enumerate(rewards):
            rows.append(Trajectory(
                id=trajectory_id(str(run.pk), seq, sample), run_id=str(run.pk), seq=seq, sample=sample,
                domain="arithmetic", template="task_template/add-two@1", task_key=key, task_hash="0" * 64,
                image="sandbox_image/py-basic@1", verifier="verifier/numeric@1", policy_version=0, step=1,
                prompt_ids=[1], turns=[Turn(role="user", content=f"{key}?"),
                                       Turn(role="assistant", content=f"answer {sample}", token_ids=[7])],
                status=TrajectoryStatus.OK if reward is not None else TrajectoryStatus.INFRA_ERROR, reward=reward,
                verdict=Verdict(reward=reward, status="pass" if reward == 1 else "fail", layers_run=["exact"]),
                started_at=1_700_000_000.0, finished_at=1_700_000_001.0))
        seq += 1
    trajectories_record(run=run, attempt=1, trajectories=rows)
    return evaluation


@pytest.fixture
def evaluated(project, owner, suite, tiny):
    return _answered(evaluation_launch(project=project, suite=suite, actor=owner, model=tiny))


def test_the_exports_carry_every_answer_and_the_studios_own_score(evaluated, tmp_path, capsys):
    rows = [json.loads(line) for line in external.result_jsonl(evaluated)]
    assert [(r["task"], r["sample"], r["reward"]) for r in rows] == [
        (key, sample, reward) for key, rewards in REWARDS.items() for sample, reward in enumerate(rewards)]
    assert rows[1]["prompt"] == "add-00000?" and rows[1]["response"] == "answer 1"
    assert rows[-1]["status"] == "infra_error" and rows[0]["template"] == "add-two" and rows[0]["key"] == evaluated.key

    document = external.lm_eval_results(evaluated)
    studio = results.leaderboard([evaluated]).rows[0].scores[results.ALL]
    task = document["results"]["add-two"]
    assert task["reward,none"] == pytest.approx(studio.mean) == pytest.approx((1.0 + 0.5 + 0.0) / 3)
    assert task["reward_stderr,none"] == pytest.approx(0.5 / 3 ** 0.5)  # the means 1, .5, 0: sd .5, over sqrt(3)
    assert document["versions"] == {"add-two": "1"} and document["n-shot"] == {"add-two": 0}
    assert document["group_subtasks"] == {"arithmetic": ["add-two"]}
    samples = document["samples"]["add-two"]
    assert [s["doc"]["key"] for s in samples] == list(REWARDS)
    assert samples[1]["resps"] == [["answer 0", "answer 1"]] and samples[1]["reward"] == 0.5

    call_command("eval_results", "export", str(evaluated.pk), "--format", "lm-eval", "--out", str(tmp_path / "out"))
    written = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert len(written) == 2 and written[0].startswith("results_") and written[1].startswith("samples_add-two_")
    on_disk = json.loads((tmp_path / "out" / written[0]).read_text())
    assert on_disk["results"] == document["results"] and "samples" not in on_disk
    assert len((tmp_path / "out" / written[1]).read_text().splitlines()) == len(REWARDS)
    capsys.readouterr()
    call_command("eval_results", "export", str(evaluated.pk))
    assert [json.loads(line)["trajectory"] for line in capsys.readouterr().out.splitlines()] == [
        r["trajectory"] for r in rows]


def test_a_harness_file_is_an_external_row_under_its_own_key_never_on_a_suites_board(
        project, owner, suite, evaluated, api_as, client):
    api = api_as(owner)
    created = api.post(f"/projects/{project.slug}/evals/external/", {"results": HARNESS_FILE})
    assert created.status_code == 201, created.content
    body = created.json()
    assert body["what"] == "org/model-a" and body["external"] is True and body["harness_version"] == "0.4.13"
    assert body["scores"]["gsm8k"]["exact_match,flexible-extract"] == {"value": 0.3, "stderr": None}
    assert body["scores"]["arc_easy"]["acc,none"] == {"value": 0.5, "stderr": 0.05}

    # Another model on the same tasks shares the key (the configs' metadata names the model, and is left out);
    # the same tasks at another few-shot count do not.
    other = copy.deepcopy(HARNESS_FILE)
    other["configs"]["gsm8k"]["metadata"]["pretrained"] = "org/model-b"
    other["results"]["gsm8k"]["exact_match,strict-match"] = 0.5
    same = api.post(f"/projects/{project.slug}/evals/external/", {"results": other, "label": "model-b"}).json()
    fewer = copy.deepcopy(HARNESS_FILE)
    fewer["n-shot"]["gsm8k"] = 0
    apart = api.post(f"/projects/{project.slug}/evals/external/", {"results": fewer, "label": "zero-shot"}).json()
    assert same["key"] == body["key"] != apart["key"]
    assert body["key"] != suite_key(suite)[0]
    groups = selectors.external_groups(project=project)
    assert [[row.label for row in g["rows"]] for g in groups] == [["zero-shot"], ["model-b", "org/model-a"]]

    client.force_login(owner)
    page = client.get(f"/p/{project.slug}/evals/").content.decode()
    assert f'data-external-key="{body["key"]}"' in page and page.count(">external</span>") == 3
    board = client.get(f"/p/{project.slug}/evals/{suite.definition.slug}/{suite.number}/").content.decode()
    assert "org/model-a" not in board and "model-b" not in board  # shown on the evals page, never ranked here
    assert [e["what"] for e in api.get(f"/projects/{project.slug}/evals").json()] == [evaluated.label]
    listed = api.get(f"/projects/{project.slug}/evals/external/").json()
    assert sorted(e["what"] for e in listed) == ["model-b", "org/model-a", "zero-shot"]


def test_a_file_lm_eval_wrote_imports_as_it_is(project, owner, api_as):
    """tests/data/lm_eval/results_tiny-random.json: what lm-evaluation-harness 0.4.13's CLI wrote for
    tests/data/lm_eval/adder_choice.yaml against serve's app on a randomly initialised tiny model."""
    written = json.loads((ROOT / "tests" / "data" / "lm_eval" / "results_tiny-random.json").read_text())
    row = services.external_import(project=project, document=written, actor=owner)
    assert (row.label, row.harness_version) == ("tiny-random", "0.4.13")
    assert row.scores == {"adder_choice": {"acc,none": {"value": pytest.approx(5 / 12),
                                                        "stderr": pytest.approx(0.148647, abs=1e-6)}}}
    assert row.key_parts["adder_choice"]["version"] == 1.0 and row.key_parts["adder_choice"]["n-shot"] == 0
    assert row.key_parts["adder_choice"]["documents"] == 12
    again = api_as(owner).post(f"/projects/{project.slug}/evals/external/", {"results": written, "label": "again"})
    assert again.status_code == 201 and again.json()["key"] == row.key


def test_the_studios_own_export_imports_back_with_its_scores(project, evaluated, tmp_path):
    call_command("eval_results", "export", str(evaluated.pk), "--format", "lm-eval", "--out", str(tmp_path))
    [results_file] = tmp_path.glob("results_*.json")
    call_command("eval_results", "import", str(results_file), "--label", "round-trip")
    row = ExternalEvaluation.objects.get(label="round-trip")
    assert row.scores["add-two"]["reward,none"]["value"] == pytest.approx(0.5)
    assert row.results["model_name"] == evaluated.label


@pytest.mark.parametrize("document, problem", [
    ({"results": {}}, "has no `results` object of tasks"),
    ({"configs": {}}, "has no `results` object of tasks"),
    ({"results": {"t": {"acc,none": "high"}}, "model_name": "m"}, "results.t.acc,none must be a number"),
    ({"results": {"t": {"alias": "t"}}, "model_name": "m"}, "results.t has no metric"),
    ({"results": {"t": {"acc,none": 0.5}}}, "name the model"),
    ({"results": {"t": {"acc,none": 0.5}}, "model_name": "m", "n-shot": [0]}, "`n-shot` must be an object"),
])
def test_a_file_not_in_the_harness_shape_is_refused_by_what_is_wrong(project, owner, api_as, tmp_path, document,
                                                                      problem):
    answer = api_as(owner).post(f"/projects/{project.slug}/evals/external/", {"results": document})
    assert answer.status_code == 400 and problem in answer.json()["detail"]
    path = tmp_path / "results.json"
    path.write_text(json.dumps(document))
    with pytest.raises(CommandError, match="nothing was imported"):
        call_command("eval_results", "import", str(path))
    assert not ExternalEvaluation.objects.exists()


def test_readers_export_and_only_editors_import(project, member, evaluated, api_as, client):
    viewer = member("viewer")
    reader = api_as(viewer)
    exported = reader.get(f"/projects/{project.slug}/evals/{evaluated.pk}/results?format=lm-eval")
    assert exported.status_code == 200 and "add-two" in exported.json()["results"]
    assert reader.post(f"/projects/{project.slug}/evals/external/",
                       {"results": HARNESS_FILE}).status_code == 403
    client.force_login(viewer)
    download = client.get(f"/p/{project.slug}/evals/evaluation/{evaluated.pk}/results.jsonl")
    assert download.status_code == 200 and len(b"".join(download.streaming_content).splitlines()) == 6
    lines = reader.get(f"/projects/{project.slug}/evals/{evaluated.pk}/results", format="jsonl")
    assert [json.loads(line)["reward"] for line in b"".join(lines.streaming_content).splitlines()] == [
        reward for rewards in REWARDS.values() for reward in rewards]

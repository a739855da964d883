"""The real-model demo's SFT cold start, on a tiny model: an expression task's reference calls run_python first;
`cold_start` builds a dataset of a bundle's reference check's passing trajectories (those that called the tool and
those that answered at once; of the templates named, or of every template), trains an SFT run on it, is a no-op the
second time, and a GRPO run created with `model: checkpoint <bundle>-sft@latest` starts from it."""

import json
import random

import pytest

from apps.datasets.errors import DatasetError
from apps.demo.cold_start import cold_start
from apps.registry.dataset_store import dataset_materialise
from apps.registry.services import version_publish
from apps.runs.models import Run, RunKind, RunStatus
from apps.runs.services import run_create
from apps.runs.stages import lineage
from apps.trajectories.services import trajectories_record
from workers.definitions.specs import ToolSpec
from workers.rl.models.base_model import reference_turns
from workers.rl.models.hf_tiny import make_tiny_hf_model
from workers.rl.rollout.tools import RUN_PYTHON_TOOL
from workers.rl.types import ToolCall, Trajectory, TrajectoryStatus, Turn, trajectory_id
from workers.verifiers import Verdict


def test_an_expression_tasks_reference_calls_the_tool_first():
    turns = reference_turns(tools=[ToolSpec.model_validate(RUN_PYTHON_TOOL)], inputs={"expression": "12 * 13 + 100"},
                            hidden={"answer": 256}, rng=random.Random(0), tool_call_fraction=1.0)
    assert [t["role"] for t in turns] == ["assistant", "tool", "assistant"]
    assert '"code": "print(12 * 13 + 100)"' in turns[0]["content"] and turns[2]["content"] == "256"
    assert reference_turns(tools=[], inputs={"expression": "1 + 1"}, hidden={"answer": 2},
                           rng=random.Random(0), tool_call_fraction=1.0) == [{"role": "assistant", "content": "2"}]


def _answered(run, seq: int, *, tool: bool, template: str = "task_template/add-two@1") -> Trajectory:
    call = [ToolCall(id="c1", name="run_python", arguments={"code": f"print({seq} + 1)"})] if tool else []
    turns = [Turn(role="user", content=f"What is {seq} + 1? Use the run_python tool."),
             Turn(role="assistant", content=f'<tool_call>{{"name": "run_python", "arguments": {{"code": '
                                            f'"print({seq} + 1)"}}}}</tool_call>', tool_calls=call),
             Turn(role="tool", content=str(seq + 1), tool_call_id="c1", name="run_python"),
             Turn(role="assistant", content=str(seq + 1))]
    return Trajectory(id=trajectory_id(str(run.pk), seq, 0), run_id=str(run.pk), seq=seq, sample=0,
                      domain="arithmetic", template=template, task_key=f"add-{seq:05d}",
                      task_hash="0" * 64, image="sandbox_image/py-basic@1", verifier="verifier/numeric@1",
                      policy_version=0, step=1, prompt_ids=[1], turns=turns if tool else turns[:1] + turns[3:],
                      status=TrajectoryStatus.OK, reward=1.0, verdict=Verdict(reward=1.0, status="pass"),
                      started_at=1_700_000_000.0, finished_at=1_700_000_001.0)


@pytest.mark.django_db(transaction=True)  # a training attempt closes its connection at the end, as workers do
def test_the_cold_start_trains_once_and_the_rl_run_starts_from_it(project, registry, owner, settings, tmp_path):
    settings.MODEL_DIRS = [tmp_path / "models"]
    base = make_tiny_hf_model(tmp_path / "models" / "tiny", hidden_size=32, layers=1, heads=2, max_positions=96)
    tools = version_publish(project=project, kind="bundle", slug="tools", author=owner, spec={
        "members": ["domain/arithmetic@latest"],
        "run_config": {"model": str(base), "engine": "transformers", "lora_rank": 2}}).version
    with pytest.raises(DatasetError, match="no cold start for tools: bundle tools has no completed reference check"):
        cold_start(project=project, bundle="tools", steps=2)
    check = run_create(project=project, bundle=tools, steps=1, kind=RunKind.REFERENCE, actor=owner)
    trajectories_record(run=check, attempt=1, trajectories=[_answered(check, seq, tool=seq % 2 == 0)
                                                            for seq in range(6)]
                        + [_answered(check, seq, tool=False, template="task_template/bare@1") for seq in (6, 7)])
    Run.objects.filter(pk=check.pk).update(status=RunStatus.COMPLETED)

    sft = cold_start(project=project, bundle="tools", steps=2)
    assert (sft.kind, sft.status, sft.config["dataset"]) == ("sft", "completed", "dataset/tools-cold-start@1")
    assert sft.config["lora_rank"] == 2 and sft.checkpoints.filter(step=2).exists()
    rows = [json.loads(line) for line in
            dataset_materialise(project=project, text="dataset/tools-cold-start@1").path.read_text().splitlines()]
    assert len(rows) == 8  # all that passed: three called the tool, three answered at once, two of another template
    assert sorted(any(m["role"] == "tool" for m in row["messages"]) for row in rows) == [False] * 5 + [True] * 3
    assert cold_start(project=project, bundle="tools", steps=2) == sft  # trained once

    narrowed = cold_start(project=project, bundle="tools", templates=("add-two",), steps=2)
    assert narrowed != sft and narrowed.config["dataset"] == "dataset/tools-cold-start@2"
    rows = [json.loads(line) for line in
            dataset_materialise(project=project, text="dataset/tools-cold-start@2").path.read_text().splitlines()]
    assert sorted(row["provenance"]["task_key"] for row in rows) == [f"add-{seq:05d}" for seq in range(6)]

    rl = run_create(project=project, bundle=tools, steps=1, actor=owner, name="tools-grpo",
                    overrides={"model": "checkpoint tools-sft@latest"})
    assert [(run.name, step) for run, step in lineage(rl)] == [("tools-sft", 2)]

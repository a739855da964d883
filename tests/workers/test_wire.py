"""Each type owns its wire format: what goes through JSON (a queue, a checkpoint, the archive) comes back equal,
and bytes become base64 only at the queue's edge (workers/remote.py)."""

import json
from dataclasses import replace

import pytest

from tests.support import ROOT
from workers.definitions.specs import ContextPolicy
from workers.remote import tool_result_from_wire, tool_result_to_wire, verdict_from_wire, verdict_to_wire
from workers.rl.rollout.tools import RUN_PYTHON_TOOL, PolicyToolError
from workers.rl.types import TaskTemplate, ToolCall, ToolResult, Trajectory, TrajectoryStatus, Turn
from workers.sandbox import Limits, SandboxImage
from workers.verifiers import Item, Verdict
from workers.verifiers.types import Component

PNG = b"\x89PNG\r\n\x1a\n\x00\xff binary"
IMAGE = SandboxImage(key="sandbox_image/cad@2", layers=({"type": "base", "image": "python-3.11"},
                                                        {"type": "python_packages", "packages": ["trimesh==4.12.2"]}),
                     limits=Limits(memory_mb=1024, network=False), warm_pool_size=3)


def through_json(data):
    return json.loads(json.dumps(data))


def test_a_verdict_round_trips_and_its_artifacts_cross_the_queue_as_base64():
    verdict = Verdict(reward=0.75, status="partial", layers_run=["exact", "environment"], stopped_because="decided",
                      latency_ms=12.5, cost=0.002, artifacts={"render-iso.png": PNG},
                      components=[Component(layer="exact", name="watertight", type="mesh_geometry", weight=0.0,
                                            value=1.0, status="pass", evidence="12 faces", latency_ms=3.0),
                                  Component(layer="environment", name="shape", type="mesh_geometry", weight=1.0,
                                            value=0.75, status="partial", evidence="IoU 0.75", latency_ms=9.5)])
    assert "artifacts" not in verdict.to_json()  # bytes are not JSON: they travel beside it
    assert Verdict.from_json(through_json(verdict.to_json()), artifacts=verdict.artifacts) == verdict
    wire = through_json(verdict_to_wire(verdict))
    assert isinstance(wire["artifacts"]["render-iso.png"], str)
    assert verdict_from_wire(wire) == verdict


def test_a_sandbox_image_a_task_template_and_a_task_instance_round_trip():
    """What a remote tool session and a remote verification send (workers/remote.py) and their tasks read back."""
    assert SandboxImage.from_json(through_json(IMAGE.to_json())) == IMAGE
    item = Item(key="box-2", inputs={"w": 2}, hidden={"volume": 2.0, "bounds": [[0, 0, 0], [2, 1, 1]]})
    assert Item.from_json(through_json(item.to_json())) == item
    template = TaskTemplate.from_spec(
        key="task_template/solids@1", domain="3d", image=IMAGE, verifier_key="verifier/mesh@1",
        verifier_spec={"layers": [{"name": "shape", "kind": "environment", "checks": [{"type": "mesh_geometry"}]}]},
        spec={"system_prompt": "Model it.", "prompt_template": "A box {w} wide", "sandbox_image": "cad@2",
              "verifier": "mesh@1", "tools": [RUN_PYTHON_TOOL],
              "limits": {"max_turns": 6, "max_tokens": 4096, "max_seconds": 180, "max_turn_calls": 2},
              "examples": [{"role": "user", "content": "A box 2 wide"}, {"role": "assistant", "content": "ok"}],
              "session": {"max_calls": 40, "prepare": ["pip install --user ."]},
              "context": {"when_full": "drop_tool_outputs"}})
    assert TaskTemplate.from_json(through_json(template.to_json())) == template
    without = replace(template, session=None, context=ContextPolicy(), examples=())
    assert TaskTemplate.from_json(through_json(without.to_json())) == without


def test_a_trajectory_round_trips_without_its_artifacts():
    result = ToolResult(status="ok", text="1\n", exit_code=0, stdout="1\n", wall_seconds=0.25, files=["main.py"])
    trajectory = Trajectory(id="00000000-0000-4000-8000-0000000000aa", run_id="r", seq=3, sample=1, domain="d",
                            template="t", task_key="k", task_hash="h", image="i", verifier="v", policy_version=2,
                            prompt_ids=[1, 2], status=TrajectoryStatus.TIMEOUT, reward=0.0,
                            turns=[Turn(role="assistant", content="x", token_ids=[5], logprobs=[-0.5],
                                        tool_calls=[ToolCall(id="c", name="run_python", arguments={"code": "1"})]),
                                   Turn(role="tool", content=result.text, tool_call_id="c", name="run_python",
                                        result=result)],
                            verdict=Verdict(reward=0.0, status="fail", stopped_because="not verified: a timeout"),
                            artifacts={"log.txt": b"kept in the process"})
    back = Trajectory.from_json(through_json(trajectory.to_json()))
    assert back.artifacts == {} and back.status is TrajectoryStatus.TIMEOUT
    back.artifacts = trajectory.artifacts
    assert back == trajectory


def test_trajectories_archived_before_their_verdict_and_tool_results_were_typed_read_back_the_same():
    """Written by Trajectory.to_json when `verdict` and a tool turn's `result` were dicts (the archive's rows and a
    run's checkpointed buffer hold that JSON): read as the typed values, and written back byte for byte."""
    lines = (ROOT / "tests" / "data" / "trajectories_as_archived.jsonl").read_text().splitlines()
    graded, ungraded = (Trajectory.from_json(json.loads(line)) for line in lines)
    assert [json.dumps(t.to_json()) for t in (graded, ungraded)] == lines
    assert graded.verdict.components[1].orders == [0.7, 0.8] and ungraded.verdict is None
    cut, not_run, edited = (t.result for t in graded.turns if t.role == "tool")
    assert (cut.stdout, cut.context_text_cut, cut.text) == ("42\n", True, graded.turns[3].content)
    assert not_run.status == "not_run" and graded.workspace_diff == edited.workspace_diff == "diff --git a/x b/x\n"


def test_a_tool_result_round_trips_and_a_policy_error_comes_back_as_one():
    result = ToolResult(status="error", text="Traceback ...", exit_code=1, stdout="", stderr="Traceback ...",
                        wall_seconds=0.25, cpu_seconds=0.1, assembly_seconds=0.01, attempts=2, reason="exit code 1",
                        files=["main.py"])
    assert tool_result_from_wire(through_json(tool_result_to_wire(result))) == result
    with pytest.raises(PolicyToolError, match="needs code"):
        tool_result_from_wire({"policy_error": "run_python needs code"})

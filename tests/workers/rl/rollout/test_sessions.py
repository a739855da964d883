"""Trajectories that hold one sandbox session: a reference policy drives twenty-one tool calls through one
workspace (each call sees what the ones before it wrote), the trajectory is graded, archived as JSON and read
back; and the context policy rewrites older tool outputs without re-tokenising what the policy sampled."""

import json
import time
from dataclasses import replace

import pytest

from tests.support.sandbox import process_pool
from workers.definitions.specs import ContextPolicy
from workers.rl.models.chat_formats import CharChat
from workers.rl.rollout.agent import _Sample, compact_context
from workers.rl.rollout.grading import LocalVerifier, grade_trajectory
from workers.rl.rollout.reference import reference_rollout
from workers.rl.rollout.sessions import TrajectoryTools
from workers.rl.rollout.tools import RUN_PYTHON_TOOL, SandboxToolRunner
from workers.rl.types import Task, TaskTemplate, ToolResult, Trajectory, TrajectoryStatus, Turn
from workers.sandbox import SandboxImage
from workers.sandbox.types import Limits
from workers.verifiers import Item

IMAGE = SandboxImage(key="sandbox_image/session-rollout@1", layers=({"type": "base", "image": "python-3.11"},),
                     limits=Limits(wall_seconds=5, cpu_seconds=5, memory_mb=128), warm_pool_size=1)
NUMERIC = {"layers": [{"name": "number", "kind": "exact", "checks": [
    {"type": "numeric", "name": "answer", "reference": "{answer}", "abs_tolerance": 0, "rel_tolerance": 0}]}]}
TEMPLATE = TaskTemplate.from_spec(
    key="task_template/tally@1", domain="tally", image=IMAGE, verifier_key="verifier/numeric@1", verifier_spec=NUMERIC,
    spec={"prompt_template": "{q}", "sandbox_image": "session-rollout@1", "verifier": "numeric@1",
          "tools": [RUN_PYTHON_TOOL], "limits": {"max_turns": 30, "max_tokens": 4000, "max_seconds": 120},
          "session": {"max_calls": 40, "disk_mb": 32, "memory_mb": 128, "call_seconds": 5}})
APPEND = "open('tally.txt', 'a').write('x'); print(len(open('tally.txt').read()))"


def _call(code: str) -> str:
    return "<tool_call>" + json.dumps({"name": "run_python", "arguments": {"code": code}}) + "</tool_call>"


@pytest.fixture(scope="module")
def pool():
    with process_pool(IMAGE) as pool:
        yield pool


@pytest.mark.sandbox
def test_twenty_one_tool_calls_share_one_workspace_and_the_trajectory_is_graded_and_archived(pool):
    task = Task(seq=0, template=TEMPLATE, item=Item(key="tally-21", inputs={"q": "count"}, hidden={"answer": 21}))
    answers = [_call(APPEND)] * 21 + ["21"]
    trajectory = reference_rollout("00000000-0000-4000-8000-000000000026", task, answers, SandboxToolRunner(pool))
    tool_turns = [t for t in trajectory.turns if t.role == "tool"]
    assert [t.result.stdout.strip() for t in tool_turns] == [str(n) for n in range(1, 22)]
    assert trajectory.status == TrajectoryStatus.OK and trajectory.response == "21"
    grade_trajectory(LocalVerifier(pool), task, trajectory)
    assert trajectory.reward == 1.0
    archived = Trajectory.from_json(json.loads(json.dumps(trajectory.to_json())))
    assert [t.content for t in archived.turns] == [t.content for t in trajectory.turns] and archived.reward == 1.0
    # The session went back to the pool when the trajectory ended.
    assert all(state["busy"] == 0 for state in pool.status())


@pytest.mark.sandbox
def test_a_sessions_call_budget_ends_the_trajectory_as_a_limit_not_an_error(pool):
    template = replace(TEMPLATE, session=TEMPLATE.session.model_copy(update={"max_calls": 3}))
    task = Task(seq=0, template=template, item=Item(key="tally-5", inputs={"q": "count"}, hidden={"answer": 5}))
    trajectory = reference_rollout("00000000-0000-4000-8000-000000000027", task, [_call(APPEND)] * 5 + ["5"],
                                   SandboxToolRunner(pool))
    assert [t.role for t in trajectory.turns].count("tool") == 3
    assert trajectory.status == TrajectoryStatus.OK and trajectory.limit_hit == "session_calls"


@pytest.mark.sandbox
def test_a_template_without_a_session_keeps_its_calls_stateless(pool):
    template = replace(TEMPLATE, session=None)
    tools = TrajectoryTools(SandboxToolRunner(pool), template, Item(key="k", inputs={}, hidden={}))
    assert [tools.run("run_python", {"code": APPEND}).stdout.strip() for _ in range(2)] == ["1", "1"]


def test_the_context_policy_rewrites_older_tool_outputs_and_keeps_the_sampled_ids():
    chat = CharChat()
    template = replace(TEMPLATE, context=ContextPolicy(when_full="truncate_tool_outputs", keep_last_turns=2,
                                                       truncated_chars=5))
    item = Item(key="k", inputs={"q": "count"}, hidden={})
    messages = template.messages(item)
    prompt = chat.prompt(messages, [RUN_PYTHON_TOOL])
    trajectory = Trajectory(id="t", run_id="r", seq=0, sample=0, domain="d", template="t", task_key="k",
                            task_hash="", image="i", verifier="v", policy_version=0, prompt_ids=list(prompt),
                            turns=[Turn(role="user", content="count")])
    sample = _Sample(Task(seq=0, template=template, item=item), trajectory, list(messages), list(prompt), 0.0,
                     TrajectoryTools(None, template, item))
    sampled = []
    for n in range(3):
        ids = chat.tokenizer.encode(f"call {n}") + [chat.end]  # as an engine samples them: the ids are the record
        sampled.append(ids)
        trajectory.turns.append(Turn(role="assistant", content=f"call {n}", token_ids=ids, logprobs=[-0.1] * len(ids)))
        sample.messages.append({"role": "assistant", "content": f"call {n}"})
        output = {"role": "tool", "content": f"output number {n} " * 10, "tool_call_id": f"c{n}", "name": "run_python"}
        trajectory.turns.append(Turn(role="tool", content=output["content"], name="run_python",
                                     result=ToolResult(status="ok", text=output["content"], stdout=output["content"]),
                                     token_ids=chat.continuation(sample.messages, [output], [RUN_PYTHON_TOOL])))
        sample.messages.append(output)
    before = sum(len(t.token_ids) for t in trajectory.turns) + len(prompt)
    assert compact_context(sample, chat, template.context)
    # The assistant's ids are the sampled ones; the two older outputs are cut, the newest turns kept whole.
    assert [t.token_ids for t in trajectory.turns if t.role == "assistant"] == sampled
    assert [m["content"].startswith("outpu\n[...") for m in sample.messages if m["role"] == "tool"] == [True, True,
                                                                                                        False]
    assert len(sample.context) < before and sample.context[:len(prompt)] == prompt
    ids, mask, _ = trajectory.training_sequence()
    assert ids == sample.context[:len(ids)] and sum(mask) == 0  # sampled before the rewrite: context now
    # The archive keeps every output whole for review, and says which ones the model read cut.
    assert all(t.content.count("output number") == 10 for t in trajectory.turns if t.role == "tool")
    assert [t.to_json()["result"].get("context_text_cut") for t in trajectory.turns if t.role == "tool"] == [
        True, True, None]


def test_turns_per_trajectory_and_the_share_that_hit_each_limit_are_charted_on_the_run_page():
    from apps.common.figures import panels_for
    from workers.rl.rollout.metrics import RunCounters, trajectory_shape_points

    def trajectory(turns: int, limit: str) -> Trajectory:
        made = Trajectory(id="t", run_id="r", seq=0, sample=0, domain="d", template="t", task_key="k", task_hash="",
                          image="i", verifier="v", policy_version=0, limit_hit=limit)
        made.turns = [Turn(role="assistant", content="") for _ in range(turns)]
        return made

    counters = RunCounters()
    first = trajectory_shape_points([trajectory(20, "tool_calls"), trajectory(4, ""), trajectory(30, "turns"),
                                     trajectory(6, "tool_calls")], counters)
    assert first["turns/per_trajectory_mean"] == 15 and first["turns/per_trajectory_max"] == 30
    assert (first["limits/tool_calls"], first["limits/turns"], first["limits/any"]) == (0.5, 0.25, 0.75)
    later = trajectory_shape_points([trajectory(3, "")], RunCounters.from_state(counters.state()))
    assert later["limits/tool_calls"] == later["limits/turns"] == 0.0  # still charted once the run has hit them
    assert [panel.key for panel, _ in panels_for(list(first))] == ["turns", "limits"]


def _sample_calling(template: TaskTemplate, calls: int, runner) -> _Sample:
    """A sample whose last assistant turn asks for `calls` tool calls."""
    from workers.rl.types import ToolCall

    chat, item = CharChat(), Item(key="k", inputs={"q": "count"}, hidden={})
    messages = template.messages(item)
    trajectory = Trajectory(id="t", run_id="r", seq=0, sample=0, domain="d", template="t", task_key="k",
                            task_hash="", image="i", verifier="v", policy_version=0,
                            turns=[Turn(role="user", content="count")])
    text = "".join(_call(APPEND) for _ in range(calls))
    trajectory.turns.append(Turn(role="assistant", content=text, tool_calls=[
        ToolCall(id=f"c{n}", name="run_python", arguments={"code": APPEND}) for n in range(calls)]))
    return _Sample(Task(seq=0, template=template, item=item), trajectory, messages + [
        {"role": "assistant", "content": text}], chat.prompt(messages, [RUN_PYTHON_TOOL]), 0.0,
        TrajectoryTools(runner, template, item))


@pytest.mark.sandbox
def test_a_turns_call_limit_cuts_that_turn_and_the_trajectorys_ends_it(pool):
    from workers.rl.rollout.agent import _run_sample_tools
    from workers.rl.rollout.idle import PhaseBoard

    runner = SandboxToolRunner(pool)
    per_turn = replace(TEMPLATE, limits=TEMPLATE.limits.model_copy(update={"max_turn_calls": 2}))
    sample = _sample_calling(per_turn, 3, runner)
    sample.started = time.monotonic()
    try:
        _run_sample_tools(sample, CharChat(), PhaseBoard(), None)
    finally:
        sample.tools.close()
    tools = [t for t in sample.trajectory.turns if t.role == "tool"]
    assert [t.result.status for t in tools] == ["ok", "ok", "not_run"]
    assert "at most 2 tool calls" in tools[2].content and not sample.done
    assert sample.trajectory.limit_hit == "turn_calls"

    whole = replace(TEMPLATE, limits=TEMPLATE.limits.model_copy(update={"max_tool_calls": 2}))
    sample = _sample_calling(whole, 3, runner)
    sample.started = time.monotonic()
    try:
        _run_sample_tools(sample, CharChat(), PhaseBoard(), None)
    finally:
        sample.tools.close()
    assert [t.result.status for t in sample.trajectory.turns if t.role == "tool"] == ["ok", "ok", "not_run"]
    assert sample.done and sample.trajectory.limit_hit == "tool_calls"
    assert sample.trajectory.status == TrajectoryStatus.OK

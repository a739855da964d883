"""The agent loop with a real model and real sandboxes: the policy's tool calls run in bubblewrap, their
output comes back into the context, and the limits end what runs too long or breaks the protocol (a call the
policy gets wrong ends the rollout before anything runs: those tests need no sandbox).

The policy is a TinyLM that has learned its conversations by heart (a few seconds of training), so what it
writes is known and everything after the sampling — parsing, sandboxing, context, limits — is the real code.
"""

import json
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from torch.nn import functional as F

from tests.support.sandbox import process_pool
from workers.definitions.specs import ToolSpec
from workers.rl.engines.torch_engine import TorchEngine
from workers.rl.models.chat_formats import CharChat
from workers.rl.models.tiny_lm import ModelConfig, TinyLM
from workers.rl.rollout.agent import PhaseBoard, rollout_groups
from workers.rl.rollout.tools import RUN_PYTHON_TOOL, PolicyToolError, SandboxToolRunner, parse_tool_calls
from workers.rl.types import Phase, Task, TaskTemplate, TrajectoryStatus
from workers.sandbox import SandboxImage
from workers.sandbox.types import Limits
from workers.verifiers import Item

IMAGE = SandboxImage(key="sandbox_image/agent-test@1", layers=({"type": "base", "image": "python-3.11"},),
                     limits=Limits(wall_seconds=3, cpu_seconds=3, memory_mb=128), warm_pool_size=2)
UNASKED_VERIFIER = {"layers": [{"name": "exact", "kind": "exact", "checks": [{"type": "string_check"}]}]}
IMAGE_UNWARMED = SandboxImage(key="sandbox_image/agent-test@2", layers=IMAGE.layers, limits=IMAGE.limits,
                              warm_pool_size=0)


def _call(code: str) -> str:
    return "<tool_call>" + json.dumps({"name": "run_python", "arguments": {"code": code}}) + "</tool_call>"


CONVERSATIONS = {
    "calc": [{"role": "assistant", "content": _call("print(6*7)")},
             {"role": "tool", "content": "exit code 0\nstdout:\n42\n"}, {"role": "assistant", "content": "42"}],
    "nap": [{"role": "assistant", "content": _call("import time; time.sleep(30)")}],
    "oops": [{"role": "assistant", "content": '<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>'}],
    "typo": [{"role": "assistant",
              "content": '<tool_call>{"name": "run_python", "arguments": {"code": 5}}</tool_call>'}],
}


@pytest.fixture(scope="module")
def memorising_model():
    chat = CharChat()
    rows = [chat.tokenizer.encode(chat.render([{"role": "user", "content": prompt}, *turns]))
            for prompt, turns in CONVERSATIONS.items()]
    width = max(len(r) for r in rows)
    data = torch.tensor([r + [chat.end] * (width - len(r)) for r in rows])
    torch.manual_seed(0)
    model = TinyLM(ModelConfig(vocab_size=chat.tokenizer.vocab_size, block_size=256))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(300):
        logits, _ = model(data[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), data[:, 1:].reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert loss.item() < 0.05, "the model did not learn its conversations"
    return model.eval()


@pytest.fixture(scope="module")
def pool():
    with process_pool(IMAGE) as pool:
        yield pool


class NoSandbox:
    """The tool runner of a rollout that must never run a tool."""

    def run(self, *args, **kwargs):
        raise AssertionError("a tool ran")


def _template(image=IMAGE, **spec) -> TaskTemplate:
    """A template of the agent tests (`spec`: its spec's fields); its verifier is never asked: nothing is graded."""
    return TaskTemplate.from_spec(key="task_template/agent@1", domain="agents", image=image,
                                  verifier_key="verifier/none@1", verifier_spec=UNASKED_VERIFIER,
                                  spec={"prompt_template": "{q}", "sandbox_image": "agent-test@1", "verifier": "none@1",
                                        **spec})


def _rollout(model, tool_runner, prompt: str, *, group_size=2, max_seconds=20, board=None, session=None,
             image=IMAGE, max_tool_errors=0):
    template = _template(image, tools=[RUN_PYTHON_TOOL], session=session,
                         limits={"max_turns": 3, "max_tokens": 200, "max_seconds": max_seconds,
                                 "max_tool_errors": max_tool_errors})
    task = Task(seq=0, template=template, item=Item(key=prompt, inputs={"q": prompt}, hidden={}))
    with ThreadPoolExecutor(4) as tools:
        engine = TorchEngine(model)
        [group] = rollout_groups([task], run_id="00000000-0000-4000-8000-000000000002", group_size=group_size,
                                 engine=engine, chat=CharChat(), tool_runner=tool_runner, tool_executor=tools,
                                 board=board or PhaseBoard(), seed=0, temperature=0.05)
        engine.close()
        return group


@pytest.mark.sandbox
def test_a_tool_call_runs_in_the_sandbox_and_its_output_enters_the_context(memorising_model, pool):
    board = PhaseBoard()
    for trajectory in _rollout(memorising_model, SandboxToolRunner(pool), "calc", board=board):
        assert [t.role for t in trajectory.turns] == ["user", "assistant", "tool", "assistant"]
        call, result, answer = trajectory.turns[1], trajectory.turns[2], trajectory.turns[3]
        assert call.tool_calls[0].name == "run_python" and call.finish_reason == "tool_calls"
        assert result.result.status == "ok" and result.result.stdout == "42\n"
        assert result.content == "exit code 0\nstdout:\n42\n" and result.tool_call_id == call.tool_calls[0].id
        assert trajectory.response == "42" and trajectory.status == TrajectoryStatus.OK
        assert trajectory.costs["sandbox_cpu_seconds"] > 0
        assert {"generation", "environment_assembly", "tools"} <= set(trajectory.timings)
        # Trained on exactly the policy's own tokens; the prompt and the tool's output are context.
        ids, mask, logprobs = trajectory.training_sequence()
        own = len(call.token_ids) + len(answer.token_ids)
        assert sum(mask) == own and len(ids) == len(trajectory.prompt_ids) + own + len(result.token_ids)
        assert all(lp == 0.0 for lp, m in zip(logprobs, mask, strict=True) if not m)
        assert CharChat().tokenizer.decode(result.token_ids).startswith("<tool_response>exit code 0")
    # Finished rollouts wait for verification; nothing is left in the sandbox phases.
    assert board.in_flight() == 2


@pytest.mark.sandbox
def test_a_templates_session_runs_the_rollouts_calls_and_is_given_back(memorising_model, pool):
    """The agent loop's session path: opened at the first call, the call run in it, closed at the end (that calls
    share its workspace: tests/workers/rl/rollout/test_sessions.py)."""
    session = {"idle_timeout": 60, "lifetime": 60, "max_calls": 10, "disk_mb": 16, "memory_mb": 128,
               "call_seconds": 3, "keep_background": False, "prepare": []}
    for trajectory in _rollout(memorising_model, SandboxToolRunner(pool), "calc", session=session):
        assert [t.result.stdout for t in trajectory.turns if t.role == "tool"] == ["42\n"]
        assert trajectory.response == "42" and trajectory.status == TrajectoryStatus.OK
        assert trajectory.restarts == 0 and trajectory.timings["environment_assembly"] > 0
    assert all(state["busy"] == 0 for state in pool.status())  # both samples' sessions were given back


@pytest.mark.sandbox
def test_a_sample_whose_session_could_not_be_had_starts_over_and_is_never_scored_for_it(memorising_model):
    """Room for one session at a time: the group's second sample cannot open one while the first holds it (an
    infrastructure error, not the policy's), so it starts over once the first is done, and ends like the first."""
    session = {"idle_timeout": 60, "lifetime": 60, "max_calls": 10, "disk_mb": 16, "memory_mb": 128,
               "call_seconds": 3, "keep_background": False, "prepare": []}
    with process_pool(session_ceiling=1) as single:
        runner = SandboxToolRunner(single, session_open_timeout=3)
        group = _rollout(memorising_model, runner, "calc", session=session, image=IMAGE_UNWARMED)
    assert sorted(t.restarts for t in group) == [0, 1]
    for trajectory in group:
        assert trajectory.status == TrajectoryStatus.OK and trajectory.response == "42"
        assert [t.result.stdout for t in trajectory.turns if t.role == "tool"] == ["42\n"]


@pytest.mark.sandbox
def test_a_rollout_that_outlives_its_time_limit_ends_as_a_timeout(memorising_model, pool):
    board = PhaseBoard()
    [trajectory] = _rollout(memorising_model, SandboxToolRunner(pool), "nap", group_size=1, max_seconds=1, board=board)
    assert trajectory.status == TrajectoryStatus.TIMEOUT and "time limit" in trajectory.status_reason
    assert trajectory.turns[-1].result.status == "timeout"  # the sandbox killed the sleeper at its wall limit
    assert board.in_flight() == 0  # a timed-out rollout is not waiting for verification


def test_an_unknown_tool_is_the_policys_error(memorising_model):
    [trajectory] = _rollout(memorising_model, NoSandbox(), "oops", group_size=1)
    assert trajectory.status == TrajectoryStatus.POLICY_ERROR and "rm_rf" in trajectory.status_reason
    assert [t.role for t in trajectory.turns] == ["user", "assistant"]


@pytest.mark.parametrize(("prompt", "error"), [
    ("oops", "unknown tool 'rm_rf'"),  # refused as it is parsed
    pytest.param("typo", "run_python needs code as a string", marks=pytest.mark.sandbox)])  # as the runner takes it
def test_a_malformed_call_is_answered_with_its_error_while_the_templates_budget_lasts(memorising_model, request,
                                                                                     prompt, error):
    """As SWE-agent answers a format error: the model reads what was wrong and may try again; the call never runs
    (the sandbox pool's only call would be a later, well-formed one)."""
    runner = SandboxToolRunner(request.getfixturevalue("pool")) if prompt == "typo" else NoSandbox()
    [trajectory] = _rollout(memorising_model, runner, prompt, group_size=1, max_tool_errors=1)
    call, answer = trajectory.turns[1], trajectory.turns[2]
    assert call.finish_reason == "tool_calls" and answer.role == "tool" and answer.tool_call_id == call.tool_calls[0].id
    assert answer.result.status == "policy_error" and answer.content.startswith(f"[not run: {error}")
    assert CharChat().tokenizer.decode(answer.token_ids).startswith("<tool_response>[not run: ")  # in the context
    assert len(trajectory.turns) > 3  # the model wrote again after reading it
    # The budget is one: a second malformed call ends the rollout as before, its error unanswered.
    errors = [t for t in trajectory.turns if t.role == "tool" and t.result.status == "policy_error"]
    assert len(errors) == 1
    assert trajectory.status == TrajectoryStatus.OK or trajectory.turns[-1].role == "assistant"


def test_malformed_calls_are_refused_before_anything_runs():
    tools = [ToolSpec.model_validate(RUN_PYTHON_TOOL)]
    assert parse_tool_calls("no call here", tools) == []
    for text, message in [("<tool_call>{not json</tool_call>", "not JSON"),
                          ('<tool_call>{"arguments": {}}</tool_call>', "needs"),
                          ('<tool_call>{"name": "run_python", "arguments": {}}</tool_call>', "needs code"),
                          ('<tool_call>{"name": "run_python", "arguments": [1]}</tool_call>', "JSON object")]:
        with pytest.raises(PolicyToolError, match=message):
            parse_tool_calls(text, tools)


def test_the_trainers_idle_time_is_shared_out_by_phase():
    board = PhaseBoard()
    board.set("a", Phase.GENERATION)
    board.set("b", Phase.TOOLS)
    board.accrue(2.0)
    board.set("b", Phase.VERIFICATION)
    board.accrue(1.0)
    board.finish("a", timed_out=True)  # waiting on a rollout that then timed out was waiting on the timeout
    board.finish("b")
    idle = board.drain()
    assert idle == {"environment_assembly": 0.0, "generation": 0.0, "tools": 1.0, "verification": 0.5,
                    "timeouts": 1.5}
    board.accrue(0.5)  # nothing in flight: the trainer waits for generation to start
    assert board.drain()["generation"] == 0.5


def test_a_templates_examples_are_in_the_prompt_but_not_among_the_trajectorys_turns(memorising_model):
    template = _template(limits={"max_turns": 1, "max_tokens": 20, "max_seconds": 20},
                         examples=[{"role": "user", "content": "ping"}, {"role": "assistant", "content": "pong"}])
    task = Task(seq=0, template=template, item=Item(key="calc", inputs={"q": "calc"}, hidden={}))
    with ThreadPoolExecutor(1) as tools:
        engine = TorchEngine(memorising_model)
        [[trajectory]] = rollout_groups([task], run_id="00000000-0000-4000-8000-000000000003", group_size=1,
                                        engine=engine, chat=CharChat(), tool_runner=NoSandbox(), tool_executor=tools,
                                        board=PhaseBoard(), seed=0, temperature=0.05)
        engine.close()
    assert CharChat().tokenizer.decode(trajectory.prompt_ids) == "ping\x02pong\x03calc\x02"
    assert [t.role for t in trajectory.turns] == ["user", "assistant"] and trajectory.turns[0].content == "calc"
    assert trajectory.response == trajectory.turns[1].content != "pong"

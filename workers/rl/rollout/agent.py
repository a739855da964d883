"""The agent loop: a group of samples of one task, each a multi-turn conversation in which the policy may call
the template's tools, and the calls run in the sandbox pool.

Per sample: the policy writes a turn; if it calls tools, they run (concurrently across the group) and their
results join the context; repeat until the policy answers without a tool call or a limit ends it:
- turns (`max_turns` assistant turns), tokens (`max_tokens` sampled over all turns, and the model's context),
  time (`max_seconds` of wall clock: the sample ends as a timeout, reward 0);
- a malformed tool call ends the sample as a policy error (reward 0); a sandbox that keeps failing after its
  retries ends it as an infrastructure error (never scored, never trained on).
The first turn of a group is one engine request for all samples (they share the prompt and its KV cache).
"""

from __future__ import annotations

import time
from concurrent.futures import Executor
from dataclasses import dataclass

from workers.telemetry import log_context

from ..engines import GenerationRequest
from ..protocols import ChatFormat, Engine, ToolRunner
from ..types import Phase, Task, ToolCall, Trajectory, TrajectoryStatus, Turn, trajectory_id
from .idle import PhaseBoard
from .tools import PolicyToolError, parse_tool_calls


@dataclass
class _Sample:
    task: Task
    trajectory: Trajectory
    messages: list[dict]
    context: list[int]
    started: float  # monotonic
    tokens_used: int = 0
    done: bool = False

    @property
    def limits(self) -> dict:
        return self.task.template.limits


def request_seed(seed: int, seq: int, sample: int, turn: int) -> int:
    """A per-request sampling seed: the same draw, sample and turn sample the same way in any order."""
    return (((seed * 1_000_003 + seq) * 1009 + sample) * 131 + turn) % (2 ** 62)


def rollout_groups(tasks: list[Task], *, run_id: str, group_size: int, engine: Engine, chat: ChatFormat,
                   tool_runner: ToolRunner, tool_executor: Executor, board: PhaseBoard, seed: int,
                   temperature: float = 1.0) -> list[list[Trajectory]]:
    """`group_size` samples of each task, rolled out together: every turn is one engine call for all the
    samples still going (a group's first turn is one request: its samples share the prompt), then their tool
    calls run concurrently in the sandbox pool. Returns the groups in the order of `tasks`."""
    wall_started = time.time()
    samples: list[_Sample] = []
    for task in tasks:
        template, item = task.template, task.item
        messages = template.messages(item)
        prompt_ids = chat.prompt(messages, list(template.tools))
        if engine.max_context:
            reserve = min(template.limits["max_tokens"], engine.max_context // 2)
            prompt_ids = prompt_ids[-(engine.max_context - reserve):]  # the tail: where the question ends
        for index in range(group_size):
            trajectory = Trajectory(
                id=trajectory_id(run_id, task.seq, index), run_id=run_id, seq=task.seq, sample=index,
                domain=template.domain, template=template.key, task_key=item.key, task_hash=task.item_hash,
                image=template.image.key, verifier=template.verifier_key, policy_version=engine.policy_version,
                prompt_ids=list(prompt_ids),
                turns=[Turn(role=m["role"], content=m["content"]) for m in template.messages(item, examples=False)],
                started_at=wall_started)
            samples.append(_Sample(task, trajectory, list(messages), list(prompt_ids), time.monotonic()))
            board.set(trajectory.id, Phase.GENERATION)
    try:
        turn = 0
        while True:
            for sample in samples:
                if sample.done:
                    continue
                limits = sample.limits
                if turn >= limits["max_turns"]:
                    _end(sample, TrajectoryStatus.OK, "turn limit reached")
                elif time.monotonic() - sample.started > limits["max_seconds"]:
                    _end(sample, TrajectoryStatus.TIMEOUT, f"time limit of {limits['max_seconds']:g} s reached")
            active = [s for s in samples if not s.done]
            if not active:
                break
            _generate_turn(active, turn, engine, chat, seed, temperature, board)
            calling = [s for s in active if not s.done and s.trajectory.turns[-1].tool_calls]
            for sample in [s for s in calling if turn == s.limits["max_turns"] - 1]:
                _end(sample, TrajectoryStatus.OK, f"turn limit of {sample.limits['max_turns']} reached with a tool "
                                                  "call unanswered")
            calling = [s for s in calling if not s.done]
            if calling:
                list(tool_executor.map(lambda s: _run_tools(s, chat, tool_runner, board, engine.max_context), calling))
            turn += 1
    except Exception:
        for sample in samples:
            board.finish(sample.trajectory.id)
        raise
    for sample in samples:
        sample.trajectory.timings["rollout"] = time.monotonic() - sample.started
        if sample.trajectory.status == TrajectoryStatus.TIMEOUT:
            board.finish(sample.trajectory.id, timed_out=True)
        else:
            board.set(sample.trajectory.id, Phase.VERIFICATION)
    return [[s.trajectory for s in samples[index * group_size:(index + 1) * group_size]]
            for index in range(len(tasks))]


def record_tool_result(trajectory: Trajectory, call: ToolCall, result, *, call_started: float,
                       started: float) -> Turn | None:
    """Account a tool call's result to its trajectory (assembly and tool time, sandbox CPU, retries) and append
    the tool turn; `call_started` and `started` are time.monotonic() readings. A sandbox that failed appends no
    turn: the trajectory becomes an infrastructure error and None is returned."""
    _add(trajectory.timings, "environment_assembly", result.assembly_seconds)
    _add(trajectory.timings, "tools", max(0.0, time.monotonic() - call_started - result.assembly_seconds))
    _add(trajectory.costs, "sandbox_cpu_seconds", result.cpu_seconds)
    trajectory.tool_retries += result.attempts - 1
    if result.status == "infra_error":
        if trajectory.status == TrajectoryStatus.OK:
            trajectory.status = TrajectoryStatus.INFRA_ERROR
            trajectory.status_reason = f"{call.name}: the sandbox failed: {result.reason}"
        return None
    turn = Turn(role="tool", content=result.text, tool_call_id=call.id, name=call.name, result=result.to_json(),
                started_s=round(call_started - started, 4), duration_s=round(time.monotonic() - call_started, 4))
    trajectory.turns.append(turn)
    return turn


def _add(totals: dict, key: str, value: float) -> None:
    totals[key] = totals.get(key, 0.0) + value


def _end(sample: _Sample, status: TrajectoryStatus, reason: str) -> None:
    sample.done = True
    if sample.trajectory.status == TrajectoryStatus.OK:
        sample.trajectory.status = status
        sample.trajectory.status_reason = reason


def _budget(sample: _Sample, engine) -> int:
    room = sample.limits["max_tokens"] - sample.tokens_used
    if engine.max_context:
        room = min(room, engine.max_context - len(sample.context))
    return room


def _generate_turn(active: list[_Sample], turn: int, engine, chat, seed, temperature, board) -> None:
    for sample in active:
        if _budget(sample, engine) <= 0:
            _end(sample, TrajectoryStatus.OK, "no token budget left")
    live = [s for s in active if not s.done]
    if not live:
        return
    # A group's first turn is one request (its samples share the prompt); later turns, one per sample.
    calls: list[list[_Sample]] = []
    if turn == 0:
        by_task: dict[int, list[_Sample]] = {}
        for sample in live:
            by_task.setdefault(sample.task.seq, []).append(sample)
        calls = list(by_task.values())
        requests = [GenerationRequest(group[0].context, len(group), _budget(group[0], engine), chat.stop_ids,
                                      temperature, request_seed(seed, group[0].task.seq, -1, 0),
                                      messages=tuple(group[0].messages), tools=tuple(group[0].task.template.tools))
                    for group in calls]
    else:
        calls = [[s] for s in live]
        requests = [GenerationRequest(s.context, 1, _budget(s, engine), chat.stop_ids, temperature,
                                      request_seed(seed, s.task.seq, s.trajectory.sample, turn),
                                      messages=tuple(s.messages), tools=tuple(s.task.template.tools))
                    for s in live]
    for sample in live:
        board.set(sample.trajectory.id, Phase.GENERATION)
    call_started = time.monotonic()
    results = engine.generate(requests)
    seconds = time.monotonic() - call_started
    for group, completions in zip(calls, results, strict=True):
        for sample, completion in zip(group, completions, strict=True):
            _take_completion(sample, completion, turn, chat, call_started, seconds)


def _take_completion(sample: _Sample, completion, turn: int, chat, call_started: float, seconds: float) -> None:
    trajectory = sample.trajectory
    tools = list(sample.task.template.tools)
    if completion.finish_reason == "error":  # no answer at all: the infrastructure's fault, never scored
        _add(trajectory.timings, "generation", seconds)
        _end(sample, TrajectoryStatus.INFRA_ERROR, f"the engine gave no answer: {completion.error}")
        return
    text = completion.text if completion.text is not None else chat.decode(completion.token_ids)
    assistant = Turn(role="assistant", content=text, token_ids=completion.token_ids, logprobs=completion.logprobs,
                     finish_reason=completion.finish_reason, started_s=round(call_started - sample.started, 4),
                     duration_s=round(seconds, 4))
    trajectory.turns.append(assistant)
    _add(trajectory.timings, "generation", seconds)
    _add(trajectory.costs, "policy_seconds", completion.compute_seconds)
    # The oldest weights that wrote any of its turns: what its staleness is measured from.
    trajectory.policy_version = completion.policy_version if turn == 0 else min(trajectory.policy_version,
                                                                                completion.policy_version)
    sample.context += completion.token_ids
    sample.tokens_used += len(completion.token_ids) if completion.usage_tokens is None else completion.usage_tokens
    sample.messages.append({"role": "assistant", "content": text})
    if not tools:
        _end(sample, TrajectoryStatus.OK, "answered")
        return
    try:
        calls = parse_tool_calls(text, tools)
    except PolicyToolError as exc:
        assistant.finish_reason = "tool_calls"
        _end(sample, TrajectoryStatus.POLICY_ERROR, str(exc))
        return
    if not calls:
        _end(sample, TrajectoryStatus.OK, "answered" if completion.finish_reason == "stop" else
             "stopped at the token limit")
        return
    assistant.finish_reason = "tool_calls"
    assistant.tool_calls = [ToolCall(id=f"call-{turn}-{n}", name=c.name, arguments=c.arguments)
                            for n, c in enumerate(calls)]


def _run_tools(sample: _Sample, chat, tool_runner, board: PhaseBoard, max_context: int | None) -> None:
    # A sample's tool calls run in a thread of their own: what they log names the trajectory.
    with log_context(run=sample.trajectory.run_id, trajectory=sample.trajectory.id):
        _run_sample_tools(sample, chat, tool_runner, board, max_context)


def _run_sample_tools(sample: _Sample, chat, tool_runner, board: PhaseBoard, max_context: int | None) -> None:
    task, started, tools = sample.task, sample.started, list(sample.task.template.tools)
    trajectory = sample.trajectory
    calls = trajectory.turns[-1].tool_calls
    new_messages = []
    for call in calls:
        board.set(trajectory.id, Phase.ENVIRONMENT_ASSEMBLY)
        call_started = time.monotonic()
        try:
            result = tool_runner.run(task.template.image, call.name, call.arguments,
                                     on_acquired=lambda: board.set(trajectory.id, Phase.TOOLS))
        except PolicyToolError as exc:
            _end(sample, TrajectoryStatus.POLICY_ERROR, str(exc))
            return
        if record_tool_result(trajectory, call, result, call_started=call_started, started=started) is None:
            sample.done = True
            return
        new_messages.append({"role": "tool", "content": result.text, "tool_call_id": call.id, "name": call.name})
    ids = chat.continuation(sample.messages, new_messages, tools)
    # The continuation's ids belong to the first of the new tool turns (they are one block of context).
    first_tool = len(trajectory.turns) - len(new_messages)
    trajectory.turns[first_tool].token_ids = ids
    sample.context += ids
    sample.messages += new_messages
    board.set(trajectory.id, Phase.GENERATION)
    if time.monotonic() - started > task.template.limits["max_seconds"]:
        _end(sample, TrajectoryStatus.TIMEOUT, f"time limit of {task.template.limits['max_seconds']:g} s reached "
                                               "during a tool call")
    elif max_context and len(sample.context) >= max_context:
        _end(sample, TrajectoryStatus.OK, "the context is full")

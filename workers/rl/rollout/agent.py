"""The agent loop: a group of samples of one task, each a multi-turn conversation in which the policy may call
the template's tools, and the calls run in the sandbox pool.

Per sample: the policy writes a turn; if it calls tools, they run (concurrently across the group) and their
results join the context; repeat until the policy answers without a tool call or a limit ends it. Limits per
trajectory end it, limits per turn cut that turn short (template limits; `trajectory.limit_hit` names the one hit):
- per trajectory: turns (`max_turns` assistant turns), tokens (`max_tokens` sampled over all turns), time
  (`max_seconds` of wall clock: the sample ends as a timeout, reward 0), tool calls (`max_tool_calls`), and the
  model's context, where the template's context policy may drop or cut older tool outputs first (the prompt and
  the last turns kept; the assistant turns sampled before are then context, never trained on);
- per turn: tokens sampled (`max_turn_tokens`), tool calls run (`max_turn_calls`: the rest are answered as not
  run) and their seconds together (`max_turn_seconds`);
- a malformed tool call (not JSON, an unknown tool, arguments the tool refuses) is answered with the error as the
  tool's result while the template's `max_tool_errors` lasts, as SWE-agent and mini-swe-agent answer a format
  error, so the model can read it and try again; the next one ends the sample as a policy error (reward 0) — the
  verdict still decides the reward of a trajectory that recovered. A sandbox that keeps failing after its
  retries, or a session whose sandbox or host is lost, ends it as an infrastructure error (never scored, never
  trained on) — a sample whose session was lost starts over once, in a fresh session.
A template with a session (sessions.py) runs all of a trajectory's tool calls in one sandbox, opened at its first
call (before its first turn when the session prepares its workspace) and given back when the trajectory ends,
however it ends. The assistant's token ids enter the context as sampled, never re-tokenised.
The first turn of a group is one engine request for all samples (they share the prompt and its KV cache).
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import Executor
from dataclasses import dataclass

from workers.definitions.specs import ContextPolicy, Limits
from workers.telemetry import log_context

from ..engines import GenerationRequest
from ..protocols import ChatFormat, Engine, ToolRunner
from ..types import Phase, Task, ToolCall, ToolResult, Trajectory, TrajectoryStatus, Turn, trajectory_id
from .idle import PhaseBoard
from .sessions import INFRA_ERROR, LIMIT, TrajectoryTools
from .swe_tools import SUBMIT_TOOL
from .tools import PolicyToolError, parse_tool_calls

log = logging.getLogger(__name__)

MAX_RESTARTS = 1  # a sample whose session was lost starts over this many times before it stays an infra error


@dataclass
class _Sample:
    task: Task
    trajectory: Trajectory
    messages: list[dict]
    context: list[int]
    started: float  # monotonic
    tools: TrajectoryTools
    tokens_used: int = 0
    turn: int = 0  # assistant turns written so far
    tool_calls: int = 0  # tool calls run so far
    tool_errors: int = 0  # malformed tool calls answered with their error so far (limits.max_tool_errors)
    malformed: str = ""  # why its last turn's tool call is malformed: the error its tool result reads
    done: bool = False
    restartable: bool = False  # ended by an infrastructure failure of its tools: may start over

    @property
    def limits(self) -> Limits:
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
        prompt_ids = _prompt_ids(task, chat, engine)
        for index in range(group_size):
            trajectory = Trajectory(
                id=trajectory_id(run_id, task.seq, index), run_id=run_id, seq=task.seq, sample=index,
                domain=task.template.domain, template=task.template.key, task_key=task.item.key,
                task_hash=task.item_hash, image=task.template.image.key, verifier=task.template.verifier_key,
                policy_version=engine.policy_version, started_at=wall_started)
            sample = _Sample(task, trajectory, [], [], 0.0, TrajectoryTools(tool_runner, task.template, task.item))
            _begin(sample, prompt_ids)
            samples.append(sample)
            board.set(trajectory.id, Phase.GENERATION)
    try:
        _open_prepared_sessions(samples, tool_executor, board)
        while True:
            for sample in samples:
                if sample.done:
                    continue
                limits = sample.limits
                if sample.turn >= limits.max_turns:
                    _end(sample, TrajectoryStatus.OK, "turn limit reached", limit="turns")
                elif time.monotonic() - sample.started > limits.max_seconds:
                    _end(sample, TrajectoryStatus.TIMEOUT, f"time limit of {limits.max_seconds:g} s reached",
                         limit="seconds")
            active = [s for s in samples if not s.done]
            if not active:
                break
            _generate_turn(active, engine, chat, seed, temperature, board)
            for sample in active:
                if sample.done:
                    sample.tools.close()  # answered: its sandbox goes back before the others' tool calls run
            calling = [s for s in active if not s.done and s.trajectory.turns[-1].tool_calls]
            for sample in [s for s in calling if s.turn == s.limits.max_turns - 1]:
                _end(sample, TrajectoryStatus.OK, f"turn limit of {sample.limits.max_turns} reached with a tool "
                                                  "call unanswered", limit="turns")
            calling = [s for s in calling if not s.done]
            if calling:
                list(tool_executor.map(lambda s: _run_tools(s, chat, board, engine.max_context), calling))
            for sample in active:
                sample.turn += 1
            for sample in samples:
                if sample.done:
                    sample.tools.close()  # its sandbox goes back now, not when the whole group is done
                    if sample.restartable and sample.trajectory.restarts < MAX_RESTARTS:
                        _restart(sample, chat, engine, board)
    except Exception:
        for sample in samples:
            board.finish(sample.trajectory.id)
        raise
    finally:
        for sample in samples:
            sample.tools.close()
    for sample in samples:
        sample.trajectory.timings["rollout"] = time.monotonic() - sample.started
        if sample.trajectory.status == TrajectoryStatus.TIMEOUT:
            board.finish(sample.trajectory.id, timed_out=True)
        else:
            board.set(sample.trajectory.id, Phase.VERIFICATION)
    return [[s.trajectory for s in samples[index * group_size:(index + 1) * group_size]]
            for index in range(len(tasks))]


def _prompt_ids(task: Task, chat, engine) -> list[int]:
    template = task.template
    prompt_ids = chat.prompt(template.messages(task.item), list(template.tool_schemas))
    if engine.max_context:
        reserve = min(template.limits.max_tokens, engine.max_context // 2)
        prompt_ids = prompt_ids[-(engine.max_context - reserve):]  # the tail: where the question ends
    return prompt_ids


def _begin(sample: _Sample, prompt_ids: list[int]) -> None:
    """The sample at its first turn: the prompt, no turns of its own, the clock started."""
    template, item, trajectory = sample.task.template, sample.task.item, sample.trajectory
    trajectory.prompt_ids = list(prompt_ids)
    trajectory.turns = [Turn(role=m["role"], content=m["content"]) for m in template.messages(item, examples=False)]
    trajectory.status, trajectory.status_reason, trajectory.limit_hit = TrajectoryStatus.OK, "", ""
    sample.messages, sample.context = list(template.messages(item)), list(prompt_ids)
    sample.started, sample.tokens_used, sample.turn, sample.tool_calls = time.monotonic(), 0, 0, 0
    sample.tool_errors, sample.malformed = 0, ""
    sample.done = sample.restartable = False


def _restart(sample: _Sample, chat, engine, board: PhaseBoard) -> None:
    """A sample whose tools failed for the infrastructure's reasons (its session's sandbox or host lost) starts
    over in a fresh session: the failed attempt is not a sample of the policy's, and its group keeps its size.
    Its time and costs so far stay on its account."""
    trajectory = sample.trajectory
    log.info("trajectory %s starts over after an infrastructure failure: %s", trajectory.id,
             trajectory.status_reason)
    trajectory.restarts += 1
    sample.tools = TrajectoryTools(sample.tools.runner, sample.task.template, sample.task.item)
    _begin(sample, _prompt_ids(sample.task, chat, engine))
    board.set(trajectory.id, Phase.GENERATION)


def _open_prepared_sessions(samples: list[_Sample], tool_executor: Executor, board: PhaseBoard) -> None:
    """Samples whose session prepares its workspace open it before their first turn, all at once: the
    preparation (or the wait for a prepared copy) overlaps the others' and no turn waits on it later."""
    opening = [s for s in samples if s.tools.stateful and s.task.template.session.prepare]
    for sample in opening:
        board.set(sample.trajectory.id, Phase.ENVIRONMENT_ASSEMBLY)

    def open_one(sample: _Sample) -> None:
        failure = sample.tools.open()
        _add(sample.trajectory.timings, "environment_assembly", sample.tools.open_seconds)
        if failure is not None:
            _end(sample, TrajectoryStatus.INFRA_ERROR, failure.reason)
            sample.restartable = True
        board.set(sample.trajectory.id, Phase.GENERATION)

    list(tool_executor.map(open_one, opening))


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
    turn = Turn(role="tool", content=result.text, tool_call_id=call.id, name=call.name, result=result,
                started_s=round(call_started - started, 4), duration_s=round(time.monotonic() - call_started, 4))
    trajectory.turns.append(turn)
    return turn


def _add(totals: dict, key: str, value: float) -> None:
    totals[key] = totals.get(key, 0.0) + value


def _end(sample: _Sample, status: TrajectoryStatus, reason: str, *, limit: str = "") -> None:
    """The sample is done; the first reason (and limit) that ended it is the one it keeps."""
    sample.done = True
    if sample.trajectory.status == TrajectoryStatus.OK and not sample.trajectory.status_reason:
        sample.trajectory.status = status
        sample.trajectory.status_reason = reason
        if limit:
            sample.trajectory.limit_hit = limit
    elif sample.trajectory.status == TrajectoryStatus.OK and status != TrajectoryStatus.OK:
        sample.trajectory.status, sample.trajectory.status_reason = status, reason


def _turn_limit(sample: _Sample, limit: str) -> None:
    """A per-turn limit cut a turn short: recorded unless a limit already ended or cut the trajectory."""
    if not sample.trajectory.limit_hit:
        sample.trajectory.limit_hit = limit


def _budget(sample: _Sample, engine) -> int:
    room = sample.limits.max_tokens - sample.tokens_used
    if sample.limits.max_turn_tokens:
        room = min(room, sample.limits.max_turn_tokens)
    if engine.max_context:
        room = min(room, engine.max_context - len(sample.context))
    return room


def _generate_turn(active: list[_Sample], engine, chat, seed, temperature, board) -> None:
    for sample in active:
        if _budget(sample, engine) <= 0:
            context_full = engine.max_context and len(sample.context) >= engine.max_context
            _end(sample, TrajectoryStatus.OK, "the context is full" if context_full else "no token budget left",
                 limit="context" if context_full else "tokens")
    live = [s for s in active if not s.done]
    if not live:
        return
    # A group's first turn is one request (its samples share the prompt); later turns, and a sample that started
    # over, one per sample.
    by_task: dict[int, list[_Sample]] = {}
    calls: list[list[_Sample]] = []
    for sample in live:
        if sample.turn == 0 and sample.trajectory.restarts == 0:
            by_task.setdefault(sample.task.seq, []).append(sample)
        else:
            calls.append([sample])
    calls = list(by_task.values()) + calls
    requests = [GenerationRequest(group[0].context, len(group), _budget(group[0], engine), chat.stop_ids,
                                  temperature, _seed(seed, group), messages=tuple(group[0].messages),
                                  tools=group[0].task.template.tool_schemas)
                for group in calls]
    for sample in live:
        board.set(sample.trajectory.id, Phase.GENERATION)
    call_started = time.monotonic()
    results = engine.generate(requests)
    seconds = time.monotonic() - call_started
    for group, completions in zip(calls, results, strict=True):
        for sample, completion in zip(group, completions, strict=True):
            _take_completion(sample, completion, chat, call_started, seconds)


def _seed(seed: int, group: list[_Sample]) -> int:
    first = group[0]
    if len(group) > 1 or (first.turn == 0 and first.trajectory.restarts == 0):
        return request_seed(seed, first.task.seq, -1, 0)
    # A restarted sample draws anew: its first attempt's draws are spent.
    return request_seed(seed, first.task.seq, first.trajectory.sample, first.turn + 1000 * first.trajectory.restarts)


def _take_completion(sample: _Sample, completion, chat, call_started: float, seconds: float) -> None:
    trajectory, turn = sample.trajectory, sample.turn
    tools = sample.task.template.tools
    if completion.finish_reason == "error":  # no answer at all: the infrastructure's fault, never scored
        _add(trajectory.timings, "generation", seconds)
        _end(sample, TrajectoryStatus.INFRA_ERROR, f"the engine gave no answer: {completion.error}")
        return
    text = completion.text if completion.text is not None else chat.decode(completion.token_ids)
    assistant = Turn(role="assistant", content=text, token_ids=completion.token_ids, logprobs=completion.logprobs,
                     finish_reason=completion.finish_reason, started_s=round(call_started - sample.started, 4),
                     duration_s=round(seconds, 4),
                     versions=list(completion.token_versions)
                     or [completion.policy_version] * len(completion.token_ids))
    trajectory.turns.append(assistant)
    _add(trajectory.timings, "generation", seconds)
    _add(trajectory.costs, "policy_seconds", completion.compute_seconds)
    # The oldest weights that wrote any of its turns: what its staleness is measured from.
    trajectory.policy_version = completion.policy_version if turn == 0 else min(trajectory.policy_version,
                                                                                completion.policy_version)
    sample.context += completion.token_ids  # as sampled: never re-tokenised from the text
    sample.tokens_used += len(completion.token_ids) if completion.usage_tokens is None else completion.usage_tokens
    sample.messages.append({"role": "assistant", "content": text})
    cut_by_turn_limit = (completion.finish_reason == "length" and sample.limits.max_turn_tokens
                         and len(completion.token_ids) >= sample.limits.max_turn_tokens)
    if cut_by_turn_limit:
        _turn_limit(sample, "turn_tokens")
    if not tools:
        _end(sample, TrajectoryStatus.OK, "answered")
        return
    try:
        calls = parse_tool_calls(text, tools)
    except PolicyToolError as exc:
        assistant.finish_reason = "tool_calls"
        if _answers_tool_error(sample):
            # One call stands for the malformed text: its tool result is the error (_run_sample_tools).
            sample.malformed = str(exc)
            assistant.tool_calls = [ToolCall(id=f"call-{turn}-0", name=MALFORMED_CALL, arguments={})]
        else:
            _end(sample, TrajectoryStatus.POLICY_ERROR, str(exc))
        return
    if not calls:
        if completion.finish_reason == "stop":
            _end(sample, TrajectoryStatus.OK, "answered")
        else:
            _end(sample, TrajectoryStatus.OK, "stopped at the token limit",
                 limit="turn_tokens" if cut_by_turn_limit else "tokens")
        return
    assistant.finish_reason = "tool_calls"
    assistant.tool_calls = [ToolCall(id=f"call-{turn}-{n}", name=c.name, arguments=c.arguments)
                            for n, c in enumerate(calls)]


def _run_tools(sample: _Sample, chat, board: PhaseBoard, max_context: int | None) -> None:
    # A sample's tool calls run in a thread of their own: what they log names the trajectory.
    with log_context(run=sample.trajectory.run_id, trajectory=sample.trajectory.id):
        _run_sample_tools(sample, chat, board, max_context)


def _not_run(call: ToolCall, why: str) -> ToolResult:
    return ToolResult(status="not_run", text=f"[not run: {why}]", reason=why)


MALFORMED_CALL = "invalid_tool_call"  # the name of the call a malformed one is recorded as (limits.max_tool_errors)
POLICY_ERROR = "policy_error"  # a ToolResult status: the call was the model's mistake, nothing ran


def refused_call(why: str) -> ToolResult:
    """The result a malformed call gets, here and from the environment server (workers/environments/episode.py)."""
    return ToolResult(status=POLICY_ERROR, text=f"[not run: {why}]", reason=why)


def _answers_tool_error(sample: _Sample) -> bool:
    """Whether this malformed call is answered with its error (and counted) rather than ending the sample."""
    if sample.tool_errors >= sample.limits.max_tool_errors:
        return False
    sample.tool_errors += 1
    return True


def _run_sample_tools(sample: _Sample, chat, board: PhaseBoard, max_context: int | None) -> None:
    task, started, limits = sample.task, sample.started, sample.limits
    trajectory = sample.trajectory
    calls = trajectory.turns[-1].tool_calls
    turn_deadline = time.monotonic() + limits.max_turn_seconds if limits.max_turn_seconds else None
    new_messages = []
    ran_this_turn, spent = 0, ""
    for call in calls:
        call_started = time.monotonic()
        if limits.max_tool_calls and sample.tool_calls >= limits.max_tool_calls:
            result, spent = _not_run(call, f"the trajectory's {limits.max_tool_calls} tool calls are spent"), \
                "tool_calls"
        elif limits.max_turn_calls and ran_this_turn >= limits.max_turn_calls:
            result = _not_run(call, f"a turn runs at most {limits.max_turn_calls} tool calls")
            _turn_limit(sample, "turn_calls")
        elif turn_deadline is not None and call_started >= turn_deadline:
            result = _not_run(call, f"this turn's {limits.max_turn_seconds:g} s for tool calls are spent")
            _turn_limit(sample, "turn_seconds")
        elif sample.malformed:
            result, sample.malformed = refused_call(sample.malformed), ""
        else:
            board.set(trajectory.id, Phase.ENVIRONMENT_ASSEMBLY)
            try:
                result = sample.tools.run(call.name, call.arguments,
                                          on_acquired=lambda: board.set(trajectory.id, Phase.TOOLS))
            except PolicyToolError as exc:
                if not _answers_tool_error(sample):
                    _end(sample, TrajectoryStatus.POLICY_ERROR, str(exc))
                    return
                result = refused_call(str(exc))
            ran_this_turn += 1
            sample.tool_calls += 1
        if result.status == LIMIT:  # the session's own budget: the trajectory ends as it stands, and is verified
            _end(sample, TrajectoryStatus.OK, f"{call.name}: {result.text}", limit=f"session_{result.reason}")
            return
        if record_tool_result(trajectory, call, result, call_started=call_started, started=started) is None:
            sample.done = True
            sample.restartable = result.status == INFRA_ERROR and sample.tools.stateful
            return
        if call.name == SUBMIT_TOOL["name"] and result.status == "ok":  # mini-swe-agent's and SWE-agent's end
            _end(sample, TrajectoryStatus.OK, "submitted")
            return
        new_messages.append({"role": "tool", "content": result.text, "tool_call_id": call.id, "name": call.name})
    ids = chat.continuation(sample.messages, new_messages, list(task.template.tool_schemas))
    # The continuation's ids belong to the first of the new tool turns (they are one block of context).
    first_tool = len(trajectory.turns) - len(new_messages)
    trajectory.turns[first_tool].token_ids = ids
    sample.context += ids
    sample.messages += new_messages
    board.set(trajectory.id, Phase.GENERATION)
    if time.monotonic() - started > limits.max_seconds:
        _end(sample, TrajectoryStatus.TIMEOUT, f"time limit of {limits.max_seconds:g} s reached during a tool call",
             limit="seconds")
    elif spent:
        _end(sample, TrajectoryStatus.OK, f"tool call limit of {limits.max_tool_calls} reached", limit=spent)
    elif max_context and task.template.context.when_full == "end":
        if len(sample.context) >= max_context:
            _end(sample, TrajectoryStatus.OK, "the context is full", limit="context")
    elif max_context and _room(sample, max_context) <= 0:
        fit_context(sample, chat, max_context)


def _room(sample: _Sample, max_context: int) -> int:
    """Tokens left for the next turn; a turn needs at least a few (a quarter of the context, or its own cap)."""
    needed = min(max_context // 4, sample.limits.max_turn_tokens or max_context // 4)
    return max_context - len(sample.context) - needed


def fit_context(sample: _Sample, chat, max_context: int) -> None:
    """The template's context policy, when the next turn would not fit: drop (`drop_tool_outputs`) or cut
    (`truncate_tool_outputs`) the tool outputs older than the last
    `keep_last_turns` turns and rebuild the context from the prompt and the turns' own token ids — the assistant's
    as sampled, the tool outputs as the model will now read them. The assistant turns sampled before are masked
    out of training (their context has changed). A conversation that still does not fit ends the sample (as the
    default policy, `end`, does once the context is full)."""
    if not compact_context(sample, chat, sample.task.template.context):
        _end(sample, TrajectoryStatus.OK, "the context is full", limit="context")
        return
    if _room(sample, max_context) <= 0:
        _end(sample, TrajectoryStatus.OK, "the context is full, older tool outputs left out", limit="context")


def compact_context(sample: _Sample, chat, policy: ContextPolicy) -> bool:
    """Rewrites the older tool outputs the model reads (the turns' contents stay whole for review); False when
    there is nothing older to rewrite."""
    trajectory, template = sample.trajectory, sample.task.template
    opening = len(template.messages(sample.task.item, examples=False))
    examples = len(sample.messages) - len(trajectory.turns)  # the few-shot turns come before the trajectory's own
    keep_from = max(opening, len(trajectory.turns) - policy.keep_last_turns)
    older_tools = [i for i in range(opening, keep_from) if trajectory.turns[i].role == "tool"
                   and not trajectory.turns[i].result.context_text_cut]
    if not older_tools:
        return False
    tools = list(template.tool_schemas)
    messages = list(sample.messages[:examples + opening])
    context = list(trajectory.prompt_ids)
    index = opening
    while index < len(trajectory.turns):
        turn = trajectory.turns[index]
        if turn.role == "assistant":
            context += turn.token_ids
            messages.append(sample.messages[examples + index])
            turn.masked = True
            index += 1
            continue
        block_end = index
        while block_end < len(trajectory.turns) and trajectory.turns[block_end].role == "tool":
            block_end += 1
        block = []
        for position in range(index, block_end):
            message = dict(sample.messages[examples + position])
            if position < keep_from:
                message["content"] = _shortened(message["content"], policy)
                trajectory.turns[position].result.context_text_cut = True
            block.append(message)
        ids = chat.continuation(messages, block, tools)
        trajectory.turns[index].token_ids = ids
        for position in range(index + 1, block_end):
            trajectory.turns[position].token_ids = []
        context += ids
        messages += block
        index = block_end
    sample.context, sample.messages = context, messages
    return True


def _shortened(text: str, policy: ContextPolicy) -> str:
    if policy.when_full == "drop_tool_outputs":
        return "[output left out to fit the context]"
    keep = policy.truncated_chars
    return text if len(text) <= keep else text[:keep] + f"\n[... {len(text) - keep} characters left out to fit the " \
                                                        "context]"

"""One episode: a task the studio hands a trainer elsewhere, the tool calls that trainer's model makes in it, and the
trajectory they make, graded by the task's layered verifier as the studio's own rollouts are.

The studio's agent loop (workers/rl/rollout/agent.py) writes a rollout's turns itself; here a model elsewhere writes
them and only its tool calls come in. So:
- the tools are the template's own (its tool_schemas), run as the agent loop runs them: all in one sandbox session
  for a template with `session:`, else each in a fresh sandbox (rollout/sessions.TrajectoryTools), on the same pool,
  under the same sandbox limits and egress policy. A template without a `submit` tool also offers `submit(answer)`:
  the final answer, which the verifier grades as it grades a rollout's last message;
- a call is checked as the policy's own calls are (rollout/tools.checked_call): an unknown tool, arguments that are
  not an object, a required one missing come back as a result the model reads (status `policy_error`, recorded as
  the tool turn) and the episode goes on;
- the episode ends at `submit` (the template's own: the workspace's diff is graded; the added one: the answer), when
  the template's tool-call budget or its session's budget is spent (graded as it stands), when a sandbox fails (an
  infrastructure error, never scored), or when the trainer leaves it (`abandon`: never scored, never trained on).
  A call after the end is an EpisodeError: the trainer's mistake, not its model's;
- the turns the trainer's model wrote come with the call that ends the episode, as its client reports them (OpenAI
  chat messages); the tool results are always the server's own. Without a report, each call stands as the
  assistant turn that made it.
The limits that bound generation (turns, tokens, seconds) are the trainer's: its model runs elsewhere. The tool
calls' budget (`max_tool_calls`), the session's budget and the sandbox's limits apply unchanged.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import asdict

from workers.definitions.specs import ToolSpec
from workers.rl.protocols import ToolRunner, Verifier
from workers.rl.rollout.agent import record_tool_result, refused_call
from workers.rl.rollout.grading import grade_trajectory
from workers.rl.rollout.metrics import Prices, trajectory_cost
from workers.rl.rollout.sessions import LIMIT, TrajectoryTools
from workers.rl.rollout.swe_tools import SUBMIT_TOOL
from workers.rl.rollout.tools import PolicyToolError, checked_call
from workers.rl.types import Task, ToolCall, ToolResult, Trajectory, TrajectoryStatus, Turn

SUBMIT_ANSWER = ToolSpec(
    name=SUBMIT_TOOL["name"], description="Give your final answer. The episode ends and your answer is graded.",
    parameters={"type": "object", "properties": {"answer": {"type": "string", "description": "the final answer, "
                                                            "as the task asks for it"}}, "required": ["answer"]})
ROLES = ("system", "user", "assistant", "tool")


class EpisodeError(ValueError):
    """The trainer broke the protocol: a call after the episode ended, a conversation that is not chat messages."""


class Episode:
    """One task played elsewhere. Not thread-safe: one caller at a time (a server session's own thread)."""

    def __init__(self, task: Task, *, run_id: str, tool_runner: ToolRunner, verifier: Verifier, prices: Prices):
        template = task.template
        self.task, self.verifier, self.prices = task, verifier, prices
        self.sandbox = TrajectoryTools(tool_runner, template, task.item)
        offered = list(template.tools)
        self.answer_tool = all(tool.name != SUBMIT_ANSWER.name for tool in offered)  # submit(answer) is ours
        self.offered = {tool.name: tool for tool in offered + ([SUBMIT_ANSWER] if self.answer_tool else [])}
        self.opening = template.messages(task.item, examples=False)
        self.trajectory = Trajectory(
            id=str(uuid.uuid4()), run_id=run_id, seq=task.seq, sample=0, domain=template.domain,
            template=template.key, task_key=task.item.key, task_hash=task.item_hash, image=template.image.key,
            verifier=template.verifier_key, policy_version=0, started_at=time.time(),
            turns=[Turn(role=m["role"], content=m["content"]) for m in self.opening])
        self.started = time.monotonic()
        self.calls = 0  # calls made, refused ones included: they number the calls' ids
        self.calls_run = 0  # calls that ran in a sandbox: the template's max_tool_calls counts these
        self.done = False
        self.reported: list[dict] | None = None  # the conversation as the trainer's client reported it
        self._released = False

    @property
    def id(self) -> str:
        return self.trajectory.id

    def tools(self) -> list[dict]:
        """The tools on offer, as function schemas (OpenAI's `function`, the chat templates' `tools`)."""
        return [tool.function() for tool in self.offered.values()]

    def prompt_messages(self) -> list[dict]:
        """What the model is prompted with: the template's system prompt, its examples, the task's question."""
        return self.task.template.messages(self.task.item)

    def start(self) -> None:
        """Opens the template's session now when it prepares its workspace, as the agent loop does before a
        rollout's first turn (it may take a while; the first tool call would wait for it otherwise). A session that
        cannot be opened ends the episode as an infrastructure error."""
        session = self.task.template.session
        if session is None or not session.prepare:
            return
        failure = self.sandbox.open()
        self.trajectory.timings["environment_assembly"] = self.sandbox.open_seconds
        if failure is not None:
            self._end(TrajectoryStatus.INFRA_ERROR, failure.reason)
            self._conclude()

    def call(self, name: str, arguments, *, messages: list[dict] | None = None) -> ToolResult:
        """One tool call; its result is what the model reads. `messages`: the conversation so far as the trainer's
        client has it, taken as the episode's turns should this call end it. EpisodeError after the end."""
        self._check_open()
        if messages is not None:
            self.reported = checked_messages(messages)
        self.calls += 1
        call = ToolCall(id=f"call-{self.calls}", name=name, arguments=arguments if isinstance(arguments, dict) else {})
        self._asked(call)
        try:
            checked_call(name, arguments, self.offered)
        except PolicyToolError as exc:
            return self._refused(call, str(exc))
        if name == SUBMIT_ANSWER.name and self.answer_tool:
            self.trajectory.turns.pop()  # the answer is the last assistant turn, not a call
            self._answer(str(arguments["answer"]))
            return ToolResult(status="ok", text="submitted")
        limits = self.task.template.limits
        if limits.max_tool_calls and self.calls_run >= limits.max_tool_calls:
            self._end(TrajectoryStatus.OK, f"tool call limit of {limits.max_tool_calls} reached", limit="tool_calls")
            self._conclude()
            why = f"the episode's {limits.max_tool_calls} tool calls are spent"
            return ToolResult(status="not_run", text=f"[not run: {why}]", reason=why)
        call_started = time.monotonic()
        try:
            result = self.sandbox.run(name, arguments)
        except PolicyToolError as exc:  # a tool's own check of its arguments (a type, a document id)
            return self._refused(call, str(exc))
        self.calls_run += 1
        if result.status == LIMIT:  # the session's own budget: the episode ends as it stands, and is graded
            self._end(TrajectoryStatus.OK, f"{name}: {result.text}", limit=f"session_{result.reason}")
            self._conclude()
            return result
        if record_tool_result(self.trajectory, call, result, call_started=call_started, started=self.started) is None:
            self._conclude()  # the sandbox failed: an infrastructure error (record_tool_result says so)
        elif name == SUBMIT_TOOL["name"] and result.status == "ok":  # the template's own: its diff is graded
            self._end(TrajectoryStatus.OK, "submitted")
            self._conclude()
        return result

    def finish(self, *, answer: str | None = None, messages: list[dict] | None = None) -> Trajectory:
        """The episode ends with the model's final message (`answer`; None: as it stands) and is graded."""
        self._check_open()
        if messages is not None:
            self.reported = checked_messages(messages)
        if answer is None:
            self._end(TrajectoryStatus.OK, "finished")
            self._conclude()
        else:
            self._answer(answer)
        return self.trajectory

    def abandon(self, reason: str) -> Trajectory | None:
        """The trainer left the episode unfinished: its sandbox goes back, and it is recorded as abandoned (no
        reward, never trained on). None when it had already ended (and was recorded then)."""
        if self.done:
            return None
        self.done = True
        self.release()
        trajectory = self.trajectory
        trajectory.status, trajectory.status_reason = TrajectoryStatus.ABANDONED, reason
        trajectory.finished_at = time.time()
        trajectory.timings["rollout"] = time.monotonic() - self.started
        trajectory.timings["total"] = trajectory.finished_at - trajectory.started_at
        trajectory_cost(trajectory, self.prices)
        return trajectory

    def release(self) -> None:
        """Gives the session's sandbox back (idempotent)."""
        if not self._released:
            self._released = True
            self.sandbox.close()

    def outcome(self) -> dict:
        """How the episode ended, for the trainer: its status, reward and the verdict's components by layer."""
        trajectory, verdict = self.trajectory, self.trajectory.verdict
        layers: dict[str, list[dict]] = {}
        for component in verdict.components if verdict is not None else []:
            layers.setdefault(component.layer, []).append(
                {key: value for key, value in asdict(component).items() if key not in ("layer", "orders")})
        return {"episode": trajectory.id, "status": str(trajectory.status), "reason": trajectory.status_reason,
                "reward": trajectory.reward, "verdict": verdict.status if verdict is not None else None,
                "layers": layers, "layers_run": list(verdict.layers_run) if verdict is not None else [],
                "stopped_because": verdict.stopped_because if verdict is not None else "",
                "limit_hit": trajectory.limit_hit}

    # --- internals ----------------------------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self.done:
            raise EpisodeError(f"episode {self.id} is over ({self.trajectory.status}: "
                               f"{self.trajectory.status_reason}); reset for the next one")

    def _elapsed(self) -> float:
        return round(time.monotonic() - self.started, 4)

    def _asked(self, call: ToolCall) -> None:
        """The assistant turn that made the call (until the trainer's report says what its model wrote)."""
        self.trajectory.turns.append(Turn(role="assistant", content="", tool_calls=[call], finish_reason="tool_calls",
                                          started_s=self._elapsed()))

    def _refused(self, call: ToolCall, why: str) -> ToolResult:
        result = refused_call(why)
        self.trajectory.turns.append(Turn(role="tool", content=result.text, tool_call_id=call.id, name=call.name,
                                          result=result, started_s=self._elapsed()))
        return result

    def _answer(self, answer: str) -> None:
        self.trajectory.turns.append(Turn(role="assistant", content=answer, finish_reason="stop",
                                          started_s=self._elapsed()))
        self._end(TrajectoryStatus.OK, "answered")
        self._conclude(answer=answer)

    def _end(self, status: TrajectoryStatus, reason: str, *, limit: str = "") -> None:
        """The first reason (and limit) that ended the episode is the one it keeps, as in the agent loop."""
        trajectory = self.trajectory
        if trajectory.status == TrajectoryStatus.OK and not trajectory.status_reason:
            trajectory.status, trajectory.status_reason = status, reason
            if limit:
                trajectory.limit_hit = limit

    def _conclude(self, *, answer: str | None = None) -> None:
        """The end: the sandbox goes back first (a repository's diff is verified in a fresh one), the reported turns
        are taken, and the verifier grades the episode as it grades the studio's own rollouts."""
        self.done = True
        self.release()
        if self.reported is not None:
            self._adopt(self.reported, answer=answer)
        trajectory = self.trajectory
        trajectory.timings["rollout"] = time.monotonic() - self.started
        try:
            grade_trajectory(self.verifier, self.task, trajectory)
        except Exception as exc:  # the verifier's machinery (its sandbox, the judge): never the model's doing
            trajectory.status, trajectory.reward = TrajectoryStatus.INFRA_ERROR, None
            trajectory.status_reason = f"verification failed: {type(exc).__name__}: {exc}"
        trajectory_cost(trajectory, self.prices)

    def _adopt(self, messages: list[dict], *, answer: str | None) -> None:
        """The turns the trainer's model wrote, as its client reported them, in place of the assistant turns that
        stood for its calls. Each reported tool call takes the result the server produced for the first call of
        that name not yet taken (the client's own copies of the results are not taken: the server's are what
        happened); calls the report leaves out keep their stand-in turns, after the reported ones."""
        opening = len(self.opening)
        served = []  # [assistant stand-in, its tool turn or None], in the order the calls came
        for turn in self.trajectory.turns[opening:]:
            if turn.role == "assistant" and turn.tool_calls:
                served.append([turn, None])
            elif turn.role == "tool" and served:
                served[-1][1] = turn
        turns = self.trajectory.turns[:opening]
        start = next((i for i, m in enumerate(messages) if m["role"] == "assistant"), len(messages))
        for message in messages[start:]:  # the prompt is the server's own: what came before the first answer
            role = message["role"]
            if role == "user":
                turns.append(Turn(role="user", content=message_text(message)))
            elif role == "assistant":
                calls = [reported_call(call, n) for n, call in enumerate(message.get("tool_calls") or [])]
                turns.append(Turn(role="assistant", content=message_text(message), tool_calls=calls,
                                  finish_reason="tool_calls" if calls else "stop"))
                for call in calls:
                    pair = next((p for p in served if p[0].tool_calls[0].name == call.name), None)
                    if pair is None:
                        continue  # a call the server never saw (the answer's submit, or made elsewhere)
                    served.remove(pair)
                    if pair[1] is not None:
                        pair[1].tool_call_id = call.id
                        turns.append(pair[1])
        for stand_in, tool in served:
            turns += [stand_in] + ([tool] if tool is not None else [])
        if answer is not None and (not turns or turns[-1].role != "assistant" or turns[-1].content != answer):
            turns.append(Turn(role="assistant", content=answer, finish_reason="stop", started_s=self._elapsed()))
        self.trajectory.turns = turns


def checked_messages(messages) -> list[dict]:
    """A reported conversation: a list of chat messages, each with a known role; EpisodeError names the first
    that is not."""
    if not isinstance(messages, list):
        raise EpisodeError("messages must be a list of chat messages ({role, content, tool_calls})")
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in ROLES:
            raise EpisodeError(f"messages[{index}] must be a chat message whose role is one of {', '.join(ROLES)}")
    return messages


def message_text(message: dict) -> str:
    """A message's content as text: a string, or the text parts of a list of parts (OpenAI's content parts)."""
    content = message.get("content")
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return "" if content is None else str(content)


def reported_call(call, index: int) -> ToolCall:
    """A tool call as a client reports it: OpenAI's {id, function: {name, arguments: JSON text}}, or {name,
    arguments}."""
    if not isinstance(call, dict):
        return ToolCall(id=f"reported-{index}", name="", arguments={})
    function = call.get("function") if isinstance(call.get("function"), dict) else call
    arguments = function.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            arguments = {"text": arguments}
    return ToolCall(id=str(call.get("id") or f"reported-{index}"), name=str(function.get("name", "")),
                    arguments=arguments if isinstance(arguments, dict) else {"value": arguments})

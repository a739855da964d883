"""One WebSocket session on the studio's environment server, from the trainer's side: what every client here plays
its episodes through.

The connection is OpenEnv's own client (GenericEnvClient over `/ws`) and the steps are OpenEnv's own MCP actions
(CallToolAction): nothing of the wire is written here. What is here is what the studio puts inside OpenEnv's
messages (apps/environments/server.py):
- a reset answers the episode's prompt (`messages`), its tools as function schemas (`tool_schemas`: the template's
  own, plus `submit(answer)` where the template has no submit), its task and its id;
- a tool call answers a CallToolResult whose `data` is the text the model reads; the call that ends the episode
  (`submit`, or a budget spent) answers done, the reward and, in `data`, the outcome: status and the verifier's
  components by layer;
- `submit` also takes `messages`, the conversation as the trainer has it, which the studio records as the
  episode's turns (the tool results recorded are always the server's own).

The token travels in the URL (`http://NAME:TOKEN@host:port`): OpenEnv's client opens the WebSocket with the URL's
credentials as HTTP Basic authentication, which the server reads.

Sync use (TRL calls its environments' methods synchronously): `EnvironmentSession(...).sync()` is OpenEnv's
SyncEnvClient, whose own event loop thread runs these coroutines.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

from openenv.core.env_server.mcp_types import CallToolAction
from openenv.core.generic_client import GenericEnvClient

SUBMIT = "submit"


class EpisodeRefused(RuntimeError):
    """The server refused a reset or a call (a task it does not serve, a call after the episode ended, a token
    without the environment scope, no session left): its message says why."""


@dataclass
class Opening:
    """What a reset answers: the episode the session now plays."""

    episode_id: str
    run: str  # the external run recording it
    domain: str
    template: str  # the template's exact version (task_template/slug@N)
    task: str  # the task instance's key
    messages: list[dict]  # the prompt: system prompt, examples, the task's question
    tools: list[dict]  # function schemas {name, description, parameters}, submit included
    done: bool = False  # ended before its first call (its sandbox could not be prepared): nothing to play

    def tool(self, name: str) -> dict | None:
        return next((tool for tool in self.tools if tool["name"] == name), None)

    @property
    def submit_takes_answer(self) -> bool:
        """The studio's added submit(answer) (else the template's own submit, which takes what its schema says)."""
        tool = self.tool(SUBMIT)
        return tool is not None and "answer" in tool.get("parameters", {}).get("properties", {})


@dataclass
class Reply:
    """What a tool call answers."""

    tool: str
    text: str  # what the model reads
    done: bool = False
    reward: float | None = None  # the verifier's, once done (None: not scored, an infrastructure error)
    outcome: dict = field(default_factory=dict)  # once done: status, reward, the verdict's components by layer
    status: str = ""  # the tool's: ok, error, timeout, policy_error (the model's mistake), not_run ...


def server_url(url: str, token: str | None) -> str:
    """`url` with `token` as its credentials (OpenEnv's client sends them as HTTP Basic authentication)."""
    if not token:
        return url
    parts = urlsplit(url if "://" in url else f"http://{url}")
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"trainer:{quote(token, safe='')}@{host}"))


class EnvironmentSession(GenericEnvClient):
    """A session on the environment server: `open_episode` (a reset), `call` (a tool call), `submit`; one episode
    at a time, each reset starting the next (an unfinished one is recorded as abandoned)."""

    def __init__(self, url: str, *, token: str | None = None, run: str | None = None, model: str = "",
                 client: str = "openenv", message_timeout_s: float = 600.0, connect_timeout_s: float = 30.0):
        super().__init__(base_url=server_url(url, token), connect_timeout_s=connect_timeout_s,
                         message_timeout_s=message_timeout_s)
        self.identity = {"client": client, "model": model, **({"run": run} if run else {})}
        self.opening: Opening | None = None

    async def open_episode(self, *, seed: int | None = None, domain: str | None = None, template: str | None = None,
                           task: str | None = None, trainer_step: int | None = None) -> Opening:
        """Starts the next episode: the task named (`template`, `task`, `domain`), or drawn as a run draws it
        (`seed` makes the draw the same each time). `trainer_step`: the trainer's step it is played for."""
        choice = {"seed": seed, "domain": domain, "template": template, "task": task, "trainer_step": trainer_step}
        result = await self._asked(self.reset(**self.identity, **{k: v for k, v in choice.items() if v is not None}))
        observation = result.observation
        self.opening = Opening(
            episode_id=observation["episode_id"], run=observation.get("run", ""), domain=observation["task"]["domain"],
            template=observation["task"]["template"], task=observation["task"]["task"],
            messages=observation["messages"], tools=[function_schema(t) for t in observation["tool_schemas"]],
            done=bool(result.done))
        return self.opening

    async def call(self, name: str, arguments: dict[str, Any]) -> Reply:
        """One tool call in the episode."""
        return _reply(name, await self._asked(self.step(CallToolAction(tool_name=name, arguments=arguments))))

    async def submit(self, *, answer: str | None, messages: list[dict] | None = None) -> Reply:
        """Ends the episode with the model's final answer and reports its conversation (`messages`: OpenAI chat
        messages, the prompt's included or not) as the episode's turns; the reply carries the verdict. Where the
        template has a submit of its own (a repository's: its workspace is graded), that one is called and
        `answer` stands as the final message only."""
        arguments: dict[str, Any] = {}
        if self.opening is None or self.opening.submit_takes_answer:
            arguments["answer"] = answer or ""
        if messages is not None:
            arguments["messages"] = chat_messages(messages)
        return await self.call(SUBMIT, arguments)

    async def _asked(self, request):
        try:
            return await request
        except RuntimeError as exc:  # OpenEnv's client raises the server's error message as a RuntimeError
            raise EpisodeRefused(str(exc).removeprefix("Server error: ")) from None


def function_schema(tool: dict) -> dict:
    """{name, description, parameters}, from that or OpenAI's {type: function, function: {...}}."""
    tool = tool.get("function", tool) if tool.get("type") == "function" else tool
    return {"name": tool["name"], "description": tool.get("description", ""),
            "parameters": tool.get("parameters") or {"type": "object", "properties": {}}}


def chat_messages(messages: list[dict]) -> list[dict]:
    """Messages as JSON carries them: tool-call arguments that a trainer parsed into dicts stay dicts, anything
    else that JSON cannot hold becomes its text."""
    return json.loads(json.dumps(messages, default=str))


def _reply(name: str, result) -> Reply:
    observation = result.observation
    payload = observation.get("result")
    error = observation.get("error") or {}
    if isinstance(payload, dict):
        details = payload.get("structured_content") or {}
        data = payload.get("data")
        text = "".join(part.get("text", "") for part in payload.get("content") or [] if isinstance(part, dict))
        outcome = data if isinstance(data, dict) else {}
        status = details.get("status", "")
    else:  # a server that answers the bare text
        text, outcome, status = "" if payload is None else str(payload), {}, ""
    if not text and error:
        text = error.get("message", "")
    return Reply(tool=name, text=text, done=bool(result.done), reward=result.reward, outcome=outcome,
                 status=status or ("policy_error" if error else ""))

"""The studio's environments over OpenEnv's protocol, on OpenEnv's own server (openenv-core, the `environments`
extra): `manage.py environments serve` runs it in a process of its own, and nothing else of the studio imports it.

The app is OpenEnv's HTTPEnvServer with one environment, StudioEnvironment, per session:
- WebSocket `/ws` (OpenEnv's EnvClient and MCPToolClient): `reset` starts an episode (served.py chooses its task)
  and answers its prompt's messages, its tools as function schemas and its identity; `step` takes OpenEnv's MCP
  actions, ListToolsAction and CallToolAction (a template's tools, and `submit`); `state`; `close`. The call that
  ends the episode answers done, the reward, and the verdict by layer in its result. Each episode is recorded as a
  trajectory of the external run the reset names (apps/runs/external.py), as it ends or is left.
- HTTP: `/health` (open), `/schema`, `/metadata`, `/state`, and the stateless `/reset` (a task's prompt and tools,
  nothing held or recorded) and `/step` (refused: an episode lives in a session).
Every route but /health is behind TokenGate: a project token with the environment scope (access.py). A token holds
at most `max_sessions_per_token` sessions and the server `max_sessions`; past either the client gets OpenEnv's
capacity error at once. A session idle for `idle_timeout` seconds, or whose WebSocket drops, gives its sandbox back
and its unfinished episode is recorded as abandoned.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import logging
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any

from django.db import close_old_connections
from fastapi import FastAPI, HTTPException, WebSocketDisconnect
from openenv.core.env_server.exceptions import SessionCapacityError
from openenv.core.env_server.http_server import HTTPEnvServer
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.mcp_types import (
    CallToolAction,
    CallToolObservation,
    ListToolsAction,
    ListToolsObservation,
    Tool,
    ToolError,
    ToolErrorType,
)
from openenv.core.env_server.types import ConcurrencyConfig, EnvironmentMetadata, Observation, State

from apps.common.errors import StudioError
from apps.runs.external import external_run, record_episode
from workers.environments.episode import SUBMIT_ANSWER, Episode, EpisodeError
from workers.rl.rollout.agent import POLICY_ERROR
from workers.rl.types import ToolResult

from .access import AccessRefused, Caller, environment_caller, presented_token
from .served import ServedBundle

log = logging.getLogger(__name__)

CALLER: contextvars.ContextVar[Caller] = contextvars.ContextVar("environment_caller")
# The WebSocket of the session being created (TokenGate sets it), for the reaper to hang up on.
CONNECTION: contextvars.ContextVar[FirstCallAnswered] = contextvars.ContextVar("environment_connection")
OPEN_PATHS = frozenset({"/health"})
RESET_OPTIONS = frozenset({"run", "domain", "template", "task", "trainer_step", "model", "client"})
NO_RUN = "00000000-0000-0000-0000-000000000000"  # a stateless reset's episode: shown, never recorded
FIRST_CALL_SECONDS = 10.0  # how long a WebSocket refused before any call waits for the client's first message


class ResetRefused(StudioError):
    """A reset whose options are not what a reset takes."""


class EpisodeObservation(Observation):
    """What a reset answers (its `metadata` is OpenEnv's and does not travel: everything is a field)."""

    episode_id: str
    run: str = ""  # the external run recording the episode ("": a stateless /reset records nothing)
    task: dict[str, str]  # domain, template (its exact version), task (the instance's key)
    messages: list[dict[str, Any]]  # the prompt: system prompt, examples, the task's question
    tool_schemas: list[dict[str, Any]]  # the tools as function schemas (OpenAI's `function`), submit included


class StudioEnvironment(Environment):
    """One session's episodes, one at a time; its calls run in the session's own thread (OpenEnv's executor)."""

    SUPPORTS_CONCURRENT_SESSIONS = True  # each session holds its own episode and sandbox

    def __init__(self, served: ServedBundle, database: ThreadPoolExecutor):
        super().__init__()
        self.served, self.database = served, database
        self.caller: Caller | None = CALLER.get(None)  # a stateless request's; a session's is bound by the server
        self.session = False  # a WebSocket session's: its episodes are played and recorded
        self.episode: Episode | None = None
        self.run = None  # apps.runs.models.Run recording the episode
        self.trainer_step: int | None = None
        self.closed_because = ""

    def bind(self, caller: Caller) -> None:
        self.caller, self.session = caller, True

    # --- OpenEnv's Environment ------------------------------------------------------------------------------------

    def reset(self, seed: int | None = None, episode_id: str | None = None, **options: Any) -> EpisodeObservation:
        """A new episode: `run` (the external run recording it; default: the token's name), `domain`, `template`,
        `task` (else drawn as a run draws; `seed` makes the draw reproducible), `trainer_step`, `model`, `client`
        (what the trainer says of itself). An episode still going is left first, and recorded as abandoned.
        `episode_id` is OpenEnv's and not used: the episode's id is the trajectory's, in the answer."""
        self._check_open()
        unknown = sorted(set(options) - RESET_OPTIONS)
        if unknown:
            raise ResetRefused(f"reset takes seed, {', '.join(sorted(RESET_OPTIONS))}; not {', '.join(unknown)}",
                               field=unknown[0])
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
            raise ResetRefused("seed must be a whole number, 0 or more", field="seed")
        step = options.get("trainer_step")
        if step is not None and (isinstance(step, bool) or not isinstance(step, int) or step < 0):
            raise ResetRefused("trainer_step must be a whole number, 0 or more", field="trainer_step")
        if self.episode is not None and not self.episode.done:
            self._leave("the trainer reset before the episode ended")
        text = {name: _text_option(options, name) for name in ("run", "domain", "template", "task", "model", "client")}
        task = self.served.task(seed=seed, domain=text["domain"], template=text["template"], task=text["task"])
        run = None
        if self.session:
            run = self._in_database(external_run, project=self.served.project, bundle_version=self.served.bundle,
                                    name=text["run"] or self.caller.token_name, user=self.caller.user,
                                    client=text["client"] or "openenv", model=text["model"] or "")
        self.run, self.trainer_step = run, step
        episode = self.episode = Episode(task, run_id=str(run.pk) if run else NO_RUN,
                                         tool_runner=self.served.tool_runner, verifier=self.served.verifier,
                                         prices=self.served.prices)
        if self.session:
            episode.start()  # a session that prepares its workspace opens now (and may fail: infra_error)
            if episode.done:
                self._record()
        return EpisodeObservation(
            episode_id=episode.id, run=run.name if run else "", done=episode.done,
            task={"domain": task.domain, "template": task.template.key, "task": task.item.key},
            messages=episode.prompt_messages(), tool_schemas=episode.tools())

    def step(self, action, timeout_s: float | None = None, **kwargs: Any) -> Observation:
        """ListToolsAction: the episode's tools. CallToolAction: one call; `submit` may carry `messages`, the
        conversation as the trainer's client has it, which the episode records as its turns."""
        self._check_open()
        if self.episode is None:
            if not self.session:
                raise HTTPException(409, "an episode is played in a session: connect to /ws, reset, then step")
            raise EpisodeError("no episode yet: reset first")
        episode = self.episode
        if isinstance(action, ListToolsAction):
            return ListToolsObservation(done=episode.done, tools=[
                Tool(name=tool["name"], description=tool["description"], input_schema=tool["parameters"])
                for tool in episode.tools()])
        if not isinstance(action, CallToolAction):
            raise EpisodeError(f"a step takes a list_tools or a call_tool action, not {type(action).__name__}")
        arguments = dict(action.arguments)
        messages = arguments.pop("messages", None) if action.tool_name == SUBMIT_ANSWER.name else None
        result = episode.call(action.tool_name, arguments, messages=messages)
        if episode.done:
            self._record()
        return self._observation(action.tool_name, result)

    @property
    def state(self) -> State:
        episode = self.episode
        return State(episode_id=episode.id if episode else None, step_count=episode.calls if episode else 0,
                     run=self.run.name if self.run else None, done=episode.done if episode else None,
                     task=episode.trajectory.task_key if episode else None)

    def get_metadata(self) -> EnvironmentMetadata:
        bundle = self.served.bundle
        return EnvironmentMetadata(name=f"Posttrain Studio: {bundle.ref}", version=str(bundle.number),
                                   description=f"The tasks of {bundle.ref} (project {self.served.project.slug}), "
                                               "their tools and layered verifiers; each episode is recorded in the "
                                               "studio as a trajectory of the external run its reset names.")

    def close(self) -> None:
        """The session ends (its WebSocket closed or dropped, or it idled out): its sandbox goes back, and an
        episode still going is recorded as abandoned."""
        self.closed_because = self.closed_because or "the trainer's connection closed before the episode ended"
        if self.episode is None:
            return
        if self.session and not self.episode.done:
            self._leave(self.closed_because)
        self.episode.release()

    # --- internals ----------------------------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self.closed_because:
            raise EpisodeError(f"this session is closed ({self.closed_because}); connect again to play on")

    def _leave(self, reason: str) -> None:
        trajectory = self.episode.abandon(reason)
        if trajectory is not None and self.run is not None:
            try:
                self._in_database(record_episode, self.run, trajectory, trainer_step=self.trainer_step)
            except Exception:  # a session closing has nobody to tell: the log does
                log.exception("episode %s of run %s could not be recorded as abandoned", trajectory.id, self.run.pk)

    def _record(self) -> None:
        if self.run is not None:
            self._in_database(record_episode, self.run, self.episode.trajectory, trainer_step=self.trainer_step)

    def _in_database(self, function, *args, **kwargs):
        """`function` on the server's database threads: a few connections for every session, not one each."""
        return self.database.submit(_with_connection, function, *args, **kwargs).result()

    def _observation(self, name: str, result: ToolResult) -> CallToolObservation:
        """The result as MCP's CallToolResult reads (`data` is what MCPToolClient.call_tool returns): the text the
        model reads; once the episode is over, its outcome, the verdict by layer. A policy error is also OpenEnv's
        ToolError, which MCPToolClient raises."""
        episode = self.episode
        details = {"status": result.status, "exit_code": result.exit_code, "reason": result.reason}
        payload = {"content": [{"type": "text", "text": result.text}], "structured_content": details,
                   "data": result.text, "is_error": result.status not in ("ok", "not_run")}
        if episode.done:
            details["outcome"] = payload["data"] = episode.outcome()
        error = None
        if result.status == POLICY_ERROR:
            kind = ToolErrorType.TOOL_NOT_FOUND if name not in episode.offered else ToolErrorType.INVALID_ARGS
            error = ToolError(error_type=kind, message=result.reason)
        return CallToolObservation(tool_name=name, result=payload, error=error, done=episode.done,
                                   reward=episode.trajectory.reward if episode.done else None)


def _text_option(options: dict, name: str) -> str | None:
    value = options.get(name)
    if value is None:
        return None
    if not isinstance(value, str):
        raise ResetRefused(f"{name} must be text", field=name)
    return value.strip() or None


def _with_connection(function, *args, **kwargs):
    close_old_connections()  # a connection the database dropped, or older than CONN_MAX_AGE, is opened anew
    return function(*args, **kwargs)


class StudioEnvServer(HTTPEnvServer):
    """OpenEnv's server, with the caller bound to each session it creates and counted against its token's bound,
    and an idle reaper that leaves a session whose step is still running alone."""

    def __init__(self, served: ServedBundle, *, max_sessions: int, max_sessions_per_token: int,
                 idle_timeout: float, database_threads: int = 4):
        self.database = ThreadPoolExecutor(max_workers=database_threads, thread_name_prefix="environments-db")
        super().__init__(partial(StudioEnvironment, served, self.database), CallToolAction, CallToolObservation,
                         concurrency_config=ConcurrencyConfig(max_concurrent_envs=max_sessions,
                                                              session_timeout=idle_timeout))
        self.max_sessions_per_token = max_sessions_per_token
        self.token_sessions: dict[int, set] = defaultdict(set)  # token id -> its sessions (and reservations)
        self.session_tokens: dict[str, int] = {}
        self.connections: dict[str, FirstCallAnswered] = {}  # session id -> its WebSocket
        self.running: dict[str, int] = defaultdict(int)  # session id -> its calls under way

    async def _create_session(self):
        caller = CALLER.get()
        held = self.token_sessions[caller.token_id]
        if len(held) >= self.max_sessions_per_token:
            raise SessionCapacityError(len(held), self.max_sessions_per_token, message=(
                f"token {caller.token_name} holds {len(held)} sessions, its bound ({self.max_sessions_per_token}: "
                "--max-sessions-per-token); close one first"))
        reservation = object()  # counted from now: no await comes between the check and this
        held.add(reservation)
        try:
            session_id, environment = await super()._create_session()
        finally:
            held.discard(reservation)
        held.add(session_id)
        self.session_tokens[session_id] = caller.token_id
        connection = CONNECTION.get(None)
        if connection is not None:
            self.connections[session_id] = connection
        environment.bind(caller)
        log.info("session %s opened by %s (%d sessions)", session_id, caller, self.active_sessions)
        return session_id, environment

    async def _destroy_session(self, session_id: str) -> None:
        token_id = self.session_tokens.pop(session_id, None)
        if token_id is not None:
            self.token_sessions[token_id].discard(session_id)
        self.connections.pop(session_id, None)
        await super()._destroy_session(session_id)

    async def _run_in_session_executor(self, session_id: str, func, *args, **kwargs):
        self.running[session_id] += 1
        try:
            return await super()._run_in_session_executor(session_id, func, *args, **kwargs)
        finally:
            self.running[session_id] -= 1
            if not self.running[session_id]:
                del self.running[session_id]
            self._update_session_activity(session_id)

    async def _reap_idle_sessions(self) -> None:
        """Destroys the sessions idle for longer than the timeout. OpenEnv's reaper wakes every max(timeout / 4,
        5 s) and times a session from its last finished step, so a step longer than the timeout (a repository's
        verification) lost its session mid-step; this one wakes every timeout / 4 (5 s at most) and skips a session
        with a step under way."""
        timeout = self._session_idle_timeout_s
        interval = min(max(timeout / 4, 0.05), 5.0)
        while True:
            try:
                await asyncio.sleep(interval)
                now = time.time()
                async with self._session_lock:
                    idle = [session_id for session_id, info in self._session_info.items()
                            if not self.running.get(session_id) and now - info.last_activity_at > timeout]
                for session_id in idle:
                    why = f"the session was idle for more than {timeout:g} s"
                    environment = self._sessions.get(session_id)
                    if environment is not None:
                        environment.closed_because = why
                    connection = self.connections.get(session_id)
                    log.info("session %s idle for more than %g s: closed", session_id, timeout)
                    await self._destroy_session(session_id)
                    if connection is not None:
                        # OpenEnv's handler would wait on a silent client for ever: its socket and task with it.
                        # Closed, the client's next call fails with the reason (the close frame's).
                        await connection.hang_up(f"{why}; connect again to play on")
            except asyncio.CancelledError:
                break
            except Exception:
                log.exception("the idle-session reaper failed; it tries again")


class TokenGate:
    """ASGI middleware in front of OpenEnv's app: every route but /health takes a token (access.py). A refused
    WebSocket is accepted and answered with OpenEnv's error message, then closed (1008), so that the client's first
    call says why instead of a bare handshake failure."""

    def __init__(self, app, *, served: ServedBundle, database: ThreadPoolExecutor):
        self.app, self.served, self.database = app, served, database

    async def __call__(self, scope, receive, send):
        if scope["type"] not in ("http", "websocket") or scope["path"] in OPEN_PATHS:
            return await self.app(scope, receive, send)
        connection = None
        if scope["type"] == "websocket":
            connection = FirstCallAnswered(receive, send)
            receive, send = connection.channels()
        headers = dict(scope.get("headers") or [])
        plaintext = presented_token(headers.get(b"authorization", b"").decode("latin-1"))
        try:
            caller = await asyncio.get_running_loop().run_in_executor(
                self.database, partial(_with_connection, environment_caller, plaintext=plaintext,
                                       project=self.served.project))
        except AccessRefused as exc:
            return await (_refuse_websocket if scope["type"] == "websocket" else _refuse_http)(exc, receive, send)
        token, connected = CALLER.set(caller), CONNECTION.set(connection)
        try:
            await self.app(scope, receive, send)
        except WebSocketDisconnect:
            # OpenEnv's /ws closes its socket last, after the session is destroyed; once the client has gone,
            # Starlette raises for that close (OpenEnv catches only the RuntimeError older Starlettes raised).
            pass
        finally:
            CONNECTION.reset(connected)
            CALLER.reset(token)


class FirstCallAnswered:
    """A WebSocket closed by the server before its client sent anything (a refused token; OpenEnv's capacity error,
    sent as soon as the socket is accepted) is closed only once the client's first message comes, or after
    FIRST_CALL_SECONDS: the client's first call (its reset) then reads the error as its answer. Closed at once, the
    close races that call, which fails with a bare close code instead of the reason."""

    def __init__(self, receive, send):
        self._receive, self._send = receive, send
        self.heard = False  # the client sent a message, or left
        self.closed = False  # a close was sent: a second one (OpenEnv's, after the server hung up) is not

    def channels(self):
        return self.receive, self.send

    async def receive(self):
        message = await self._receive()
        if message["type"] in ("websocket.receive", "websocket.disconnect"):
            self.heard = True
        return message

    async def send(self, message):
        if message["type"] == "websocket.close":
            if self.closed:
                return
            if not self.heard:
                try:
                    await asyncio.wait_for(self.receive(), timeout=FIRST_CALL_SECONDS)
                except TimeoutError:
                    pass
            self.closed = True
        await self._send(message)

    async def hang_up(self, reason: str) -> None:
        """Closes the WebSocket from the server's side (1001, going away), its reason in the close frame."""
        if self.closed:
            return
        self.closed = True
        try:
            await self._send({"type": "websocket.close", "code": 1001, "reason": reason.encode()[:123].decode(
                "utf-8", "ignore")})
        except Exception:  # the client left meanwhile: nothing to close
            pass


async def _refuse_http(refusal: AccessRefused, receive, send) -> None:
    body = json.dumps({"detail": str(refusal)}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if refusal.status == 401:
        headers.append((b"www-authenticate", b'Bearer realm="posttrain-studio environments"'))
    await send({"type": "http.response.start", "status": refusal.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _refuse_websocket(refusal: AccessRefused, receive, send) -> None:
    message = await receive()
    if message["type"] != "websocket.connect":
        return
    code = "UNAUTHORIZED" if refusal.status == 401 else "FORBIDDEN"
    await send({"type": "websocket.accept"})
    await send({"type": "websocket.send", "text": json.dumps({"type": "error", "data": {
        "message": str(refusal), "code": code}})})
    await send({"type": "websocket.close", "code": 1008, "reason": code})


def environment_app(served: ServedBundle, *, max_sessions: int = 64, max_sessions_per_token: int = 64,
                    idle_timeout: float = 300.0) -> TokenGate:
    """The ASGI app `environments serve` runs: OpenEnv's routes for `served`, behind the token gate."""
    server = StudioEnvServer(served, max_sessions=max_sessions, max_sessions_per_token=max_sessions_per_token,
                             idle_timeout=idle_timeout)
    app = FastAPI(title=f"Posttrain Studio environments: {served.bundle.ref}",
                  description="OpenEnv's protocol: /ws (reset, step with list_tools and call_tool actions, state, "
                              "close), /reset, /step, /state, /schema, /metadata, /health.")
    server.register_routes(app)
    app.state.environment_server = server
    return TokenGate(app, served=served, database=server.database)


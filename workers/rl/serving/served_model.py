"""The model a server serves, as its routes use it: the engine and chat format behind it, the gate its requests
pass (weight_sync.Gate), and what every generation route does alike — check the bearer token, read the JSON
body, read the sampling settings, and send the request to the engine's batching loop."""

from __future__ import annotations

import asyncio
import time

from starlette.requests import Request
from starlette.responses import JSONResponse

from ..engines import GenerationRequest
from .weight_sync import BadRequest, Gate, error_response, is_bearer


class ServedModel:
    """`engine` (a BatchingEngine) with `chat` (its model's chat format), served as `model_name`. `api_token`: the
    bearer token every route but /v1/weights needs (vLLM's `--api-key`; empty: none). `policy_version`: the
    version served at start (default: the engine's)."""

    def __init__(self, *, engine, chat, model_name: str, api_token: str = "", policy_version: int | None = None):
        self.engine, self.chat, self.model_name, self.api_token = engine, chat, model_name, api_token
        self.created = int(time.time())
        self._policy_version = policy_version
        self._gate: Gate | None = None

    @property
    def gate(self) -> Gate:
        """Made on the server's event loop, at its first use."""
        if self._gate is None:
            self._gate = Gate(self.engine.policy_version if self._policy_version is None else self._policy_version)
        return self._gate

    def refused(self, request: Request) -> JSONResponse | None:
        """The 401 of a request without the API's bearer token, or None."""
        if self.api_token and not is_bearer(request.headers.get("authorization", ""), self.api_token):
            return error_response(401, "this server needs its bearer token", "authentication_error")
        return None

    async def read_body(self, request: Request) -> dict:
        """The request's JSON object; BadRequest if it is none, LookupError if it asks for another model."""
        try:
            body = await request.json()
        except ValueError:
            raise BadRequest("the body is not JSON") from None
        if not isinstance(body, dict):
            raise BadRequest("the body must be a JSON object")
        if body.get("model") not in (None, self.model_name):
            raise LookupError(f"this server serves {self.model_name!r}, not {body.get('model')!r}")
        return body

    @staticmethod
    def sampling(body: dict, default_max: int) -> dict:
        return {"n": _number(body, "n", 1, 1, 64, int),
                "temperature": _number(body, "temperature", 1.0, 0, 2),
                "max_tokens": _number(body, "max_completion_tokens", None, 1, 32_768, int)
                or _number(body, "max_tokens", default_max, 1, 32_768, int),
                "seed": _number(body, "seed", None, -2**63, 2**63 - 1, int)}

    def generation_request(self, prompt_ids: list[int], settings: dict, on_token=None) -> GenerationRequest:
        """The engine's request; BadRequest if the prompt leaves the model no room to answer."""
        engine = self.engine
        if engine.max_context and len(prompt_ids) >= engine.max_context:
            raise BadRequest(f"the prompt has {len(prompt_ids)} tokens; the model takes {engine.max_context}")
        budget = settings["max_tokens"] if not engine.max_context else \
            min(settings["max_tokens"], engine.max_context - len(prompt_ids))
        stop_ids = settings.get("stop_ids")
        return GenerationRequest(prompt_ids, settings["n"], budget,
                                 self.chat.stop_ids if stop_ids is None else stop_ids, settings["temperature"],
                                 settings["seed"], on_token=on_token)

    async def generate(self, prompt_ids: list[int], settings: dict, on_token=None):
        # Awaited, not run on a thread: a thread per waiting request would cap the clients served at once at the
        # size of a thread pool (measured: time to first token grew to seconds at 16 clients on two cores).
        # Through the gate: a weight swap waits for what is in flight and holds the next ones back.
        await self.gate.enter()
        try:
            [future] = self.engine.submit([self.generation_request(prompt_ids, settings, on_token)])
            return await asyncio.wrap_future(future)
        finally:
            self.gate.leave()

    def version_of(self, completions) -> int:
        """The oldest weights that wrote any of these answers."""
        return min((c.policy_version for c in completions), default=self.gate.version)

    @staticmethod
    def usage(prompt_ids, completions) -> dict:
        generated = sum(len(c.token_ids) for c in completions)
        return {"prompt_tokens": len(prompt_ids), "completion_tokens": generated,
                "total_tokens": len(prompt_ids) + generated}


def _number(body: dict, name: str, default, low, high, kind=float):
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or (kind is int and value != int(value)):
        raise BadRequest(f"{name} must be a number")
    if not low <= value <= high:
        raise BadRequest(f"{name} must be from {low:g} to {high:g}")
    return kind(value)

"""The model a server serves, as its routes use it: the engine and chat format behind it, the gate its requests
pass (weight_sync.Gate), and what every generation route does alike — check the bearer token, read the JSON
body, read the sampling settings, and send the request to the engine's batching loop."""

from __future__ import annotations

import asyncio
import math
import time

from starlette.requests import Request
from starlette.responses import JSONResponse

from ..engines import GenerationRequest
from .answers import stop_checker
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
    def sampling(body: dict, default_max: int, *, least_tokens: int = 1) -> dict:
        """The sampling settings both routes read (`least_tokens`: 0 where a request may ask for no new tokens,
        the completions route scoring its prompt)."""
        stop = body.get("stop")
        stops = (stop,) if isinstance(stop, str) else stop if stop is not None else ()
        if not isinstance(stops, list | tuple) or not all(isinstance(s, str) for s in stops) or len(stops) > 16:
            raise BadRequest("stop must be a string or a list of up to 16 strings", param="stop")
        max_tokens = read_number(body, "max_completion_tokens", None, least_tokens, 32_768, int)
        return {"n": read_number(body, "n", 1, 1, 64, int),
                "temperature": read_number(body, "temperature", 1.0, 0, 2),
                "max_tokens": max_tokens if max_tokens is not None else
                read_number(body, "max_tokens", default_max, least_tokens, 32_768, int),
                "seed": read_number(body, "seed", None, -2**63, 2**63 - 1, int),
                "presence_penalty": read_number(body, "presence_penalty", 0.0, -2, 2),
                "frequency_penalty": read_number(body, "frequency_penalty", 0.0, -2, 2),
                "stop": tuple(s for s in stops if s), "top_logprobs": 0, "prompt_logprobs": None}

    def token_text(self, token: int) -> str:
        """One token's own text (a stop token's marker too, which the answer's text leaves out)."""
        return self.chat.tokenizer.decode([token])

    def encode(self, text: str) -> list[int]:
        tokenizer = self.chat.tokenizer  # a Hugging Face tokenizer is called; the character one encodes
        return tokenizer(text, add_special_tokens=False)["input_ids"] if callable(tokenizer) \
            else tokenizer.encode(text)

    @property
    def vocabulary_size(self) -> int:
        tokenizer = self.chat.tokenizer
        return len(tokenizer) if hasattr(tokenizer, "__len__") else tokenizer.vocab_size

    def generation_request(self, prompt_ids: list[int], settings: dict, on_token=None) -> GenerationRequest:
        """The engine's request; BadRequest if the prompt leaves the model no room to answer."""
        engine = self.engine
        room = engine.max_context - len(prompt_ids) if engine.max_context else None
        if room is not None and (room < 1 if settings["max_tokens"] else room < 0):
            raise BadRequest(f"the prompt has {len(prompt_ids)} tokens; the model takes {engine.max_context}")
        budget = settings["max_tokens"] if room is None else min(settings["max_tokens"], room)
        stop_ids = settings.get("stop_ids")
        return GenerationRequest(prompt_ids, settings["n"], budget,
                                 self.chat.stop_ids if stop_ids is None else stop_ids, settings["temperature"],
                                 settings["seed"], top_logprobs=settings["top_logprobs"],
                                 prompt_logprobs=settings["prompt_logprobs"],
                                 presence_penalty=settings["presence_penalty"],
                                 frequency_penalty=settings["frequency_penalty"], on_token=on_token,
                                 stop_check=stop_checker(self.chat.decode, settings["stop"]) if settings["stop"]
                                 else None)

    async def generate(self, prompt_ids: list[int], settings: dict, on_token=None):
        """The `n` completions of one prompt."""
        [completions] = await self.generate_many([prompt_ids], settings, on_token)
        return completions

    async def generate_many(self, prompts: list[list[int]], settings: dict, on_token=None):
        """The `n` completions of each prompt, sent to the engine together (one batch when it is idle)."""
        # Awaited, not run on a thread: a thread per waiting request would cap the clients served at once at the
        # size of a thread pool (measured: time to first token grew to seconds at 16 clients on two cores).
        # Through the gate: a weight swap waits for what is in flight and holds the next ones back.
        requests = [self.generation_request(prompt_ids, settings, on_token) for prompt_ids in prompts]
        await self.gate.enter()
        try:
            groups = await asyncio.gather(*map(asyncio.wrap_future, self.engine.submit(requests)),
                                          return_exceptions=True)  # every one done before the gate is left
        finally:
            self.gate.leave()
        for group in groups:
            if isinstance(group, ValueError):  # refused by the engine: a prompt it cannot take, the caller's error
                raise BadRequest(str(group))
            if isinstance(group, BaseException):
                raise group
        return groups

    def version_of(self, completions) -> int:
        """The oldest weights that wrote any of these answers."""
        return min((c.policy_version for c in completions), default=self.gate.version)

    @staticmethod
    def usage(prompt_tokens: int, completion_tokens: int) -> dict:
        return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens}


def read_number(body: dict, name: str, default, low, high, kind=float):
    """body[name] checked to be a number from `low` to `high` (`kind` int: a whole one); `default` if absent."""
    value = body.get(name, default)
    if value is None:
        return default
    # NaN and Infinity too: Python's JSON reads them, and int() of either raises (a 500, not the caller's 400)
    if isinstance(value, bool) or not isinstance(value, int | float) \
            or (isinstance(value, float) and not math.isfinite(value)) or (kind is int and value != int(value)):
        raise BadRequest(f"{name} must be a number", param=name)
    if not low <= value <= high:
        raise BadRequest(f"{name} must be from {low:g} to {high:g}", param=name)
    return kind(value)

"""An OpenAI-compatible server of one model on the studio's own engines: `/v1/models`, `/v1/chat/completions`
(streamed as server-sent events when asked), `/v1/completions`, with logprobs. `manage.py serve` builds the model
(a run's checkpoint, an alias, or a base model) and runs this app under uvicorn; the studio's evaluations and its
judge layer can point at it like at any other endpoint.

Every request goes to the engine's batching loop, so concurrent clients share forward passes (continuous
batching, as in training). The conversation is rendered with the model's own chat format exactly as a rollout
renders it (`chat.prompt(messages, tools)`), so an evaluation through this server sees the prompts a direct
evaluation sees. Assistant turns that carry `tool_calls` without the call in their text get it written in the
Hermes convention the model was trained to write.

A streamed answer goes out token by token as the engine samples them (the torch and transformers engines call
back per token; vLLM's engine hands back whole answers, so there the first chunk comes with the last).

For RL generation on inference servers (engines/server.py) the server also:
- answers every completion with the `policy_version` of the weights that sampled it (a top-level field), and,
  asked with `"return_token_ids": true` (vLLM's name), the ids themselves: `prompt_token_ids` at the top level
  and each choice's `token_ids` (the stop id included when the model stopped), beside the usual `logprobs`
  (of the distribution sampled from, temperature applied). `/v1/completions` takes a prompt of token ids and
  `stop_token_ids` (vLLM's name; default: the chat format's stop ids).
- loads new weights on `POST /v1/weights` `{"location": URL or directory, "policy_version": N}`: a published
  weights directory (workers/storage; its `model.safetensors` holds the trainer's names), read from the object
  store or disk before anything pauses, then swapped in atomically between requests: new requests wait while
  the ones in flight finish on the old weights, then run on the new. `GET /v1/weights` says the version served.
  It is protected by a bearer token (`weights_token`; `serve` reads STUDIO_SERVE_WEIGHTS_TOKEN); with no token
  set, only clients on the loopback interface may load weights.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import time
import uuid
from pathlib import Path

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from workers.storage import Storage

from ..engines import GenerationRequest

DEFAULT_MAX_TOKENS = 256
LOOPBACK = ("127.0.0.1", "::1", "localhost")


class BadRequest(ValueError):
    pass


def _error(status: int, message: str, kind: str = "invalid_request_error") -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "param": None, "code": None}}, status_code=status)


def chat_messages(messages) -> list[dict]:
    """API messages as the chat format renders them (tool calls in the text, tool results as tool turns)."""
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages must be a non-empty list")
    out = []
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in ("system", "user", "assistant", "tool"):
            raise BadRequest(f"messages[{index}]: a role of system, user, assistant or tool is needed")
        content = message.get("content") or ""
        if isinstance(content, list):  # content parts: the text ones, in order
            content = "".join(part.get("text", "") for part in content if isinstance(part, dict))
        if not isinstance(content, str):
            raise BadRequest(f"messages[{index}].content must be text")
        if message["role"] == "assistant" and message.get("tool_calls") and "<tool_call>" not in content:
            for call in message["tool_calls"]:
                function = call.get("function", {})
                try:
                    arguments = json.loads(function.get("arguments") or "{}")
                except ValueError:
                    raise BadRequest(f"messages[{index}].tool_calls: arguments must be JSON") from None
                content += "\n<tool_call>\n" + json.dumps({"name": function.get("name"), "arguments": arguments}) \
                    + "\n</tool_call>"
        entry = {"role": message["role"], "content": content}
        if message["role"] == "tool":
            entry["tool_call_id"] = message.get("tool_call_id", "")
        out.append(entry)
    return out


def _number(body: dict, name: str, default, low, high, kind=float):
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or (kind is int and value != int(value)):
        raise BadRequest(f"{name} must be a number")
    if not low <= value <= high:
        raise BadRequest(f"{name} must be from {low:g} to {high:g}")
    return kind(value)


def read_weights(location: str) -> dict:
    """The state dict of the published weights directory at `location` (an object store's URL or a local
    directory), downloaded into this host's cache if remote."""
    from safetensors.torch import load_file

    def load(directory: Path) -> dict:
        path = directory / "model.safetensors"
        if not path.is_file():
            raise FileNotFoundError(f"{location} holds no model.safetensors")
        return load_file(str(path))

    if "://" not in location:
        return load(Path(location))
    with Storage(location).fetched() as directory:  # not evicted from the host's cache while it is read
        return load(directory)


def check_fits(engine, state: dict) -> None:
    """Refuses (BadRequest) weights whose names or shapes are not the served model's, before they are swapped
    in: the engine would fail every request of its next batch instead. Engines without a torch module (vLLM)
    check in their own load."""
    model = getattr(engine, "model", None)
    if model is None or not hasattr(model, "state_dict"):
        return
    expected = {name: tuple(value.shape) for name, value in model.state_dict().items()}
    missing = [n for n in expected if n not in state and not n.endswith("lm_head.weight")]
    unexpected = [n for n in state if n not in expected]
    wrong = [n for n, value in state.items() if n in expected and tuple(value.shape) != expected[n]]
    if missing or unexpected or wrong:
        raise BadRequest(f"the weights do not fit the served model: missing {missing[:3]}, unexpected "
                         f"{unexpected[:3]}, other shapes {wrong[:3]}")


class _Gate:
    """Requests in flight, and a weight swap that waits for them while holding new ones back (one event loop:
    no locks)."""

    def __init__(self, version: int):
        self.in_flight = 0
        self.open = asyncio.Event()
        self.open.set()
        self.idle = asyncio.Event()
        self.idle.set()
        self.swap = asyncio.Lock()
        self.version = version

    async def enter(self) -> None:
        while not self.open.is_set():
            await self.open.wait()
        self.in_flight += 1
        self.idle.clear()

    def leave(self) -> None:
        self.in_flight -= 1
        if not self.in_flight:
            self.idle.set()


def _bearer(request: Request, token: str) -> bool:
    return _is_bearer(request.headers.get("authorization", ""), token)


def _is_bearer(authorization: str, token: str) -> bool:
    return hmac.compare_digest(authorization.encode(), f"Bearer {token}".encode())


# --- POST /v1/weights, here and in vLLM's server (vllm_server.py) -------------------------------------------------


def may_load(authorization: str, client_host: str | None, token: str) -> bool:
    """Who may load weights: with a token, a request that carries it as its bearer token; without one, only
    loopback clients."""
    if token:
        return _is_bearer(authorization, token)
    return client_host in LOOPBACK


def loading_refused(token: str) -> JSONResponse:
    return _error(401, "loading weights needs the server's bearer token" if token else
                  "loading weights is open to loopback clients only (set a token to allow others)",
                  "authentication_error")


async def weights_request(request: Request) -> tuple[str, int]:
    """(location, policy_version) of a `POST /v1/weights` body; BadRequest if either is missing or wrong."""
    try:
        body = await request.json()
    except ValueError:
        raise BadRequest("the body is not JSON") from None
    location, version = (body.get("location"), body.get("policy_version")) if isinstance(body, dict) \
        else (None, None)
    if not isinstance(location, str) or not location:
        raise BadRequest("location: the URL or directory of a published weights directory is needed")
    if isinstance(version, bool) or not isinstance(version, int) or version < 0:
        raise BadRequest("policy_version must be a whole number, 0 or more")
    return location, version


async def swap_between_requests(door: _Gate, load, version: int) -> float:
    """Awaits `load()` while no request is in flight — new ones wait while the ones in flight finish on the old
    weights — and, if it succeeds, serves `version` from the next request on. Returns the seconds requests were
    held back."""
    started = time.monotonic()
    async with door.swap:
        door.open.clear()  # new requests wait ...
        try:
            await door.idle.wait()  # ... while the ones in flight finish on the old weights
            await load()  # swapped in before the next request is admitted
            door.version = version
        finally:
            door.open.set()
    return time.monotonic() - started


def build_app(*, engine, chat, model_name: str, weights_token: str = "", api_token: str = "",
              policy_version: int | None = None) -> Starlette:
    """The app serving `engine` (a BatchingEngine) with `chat` (its model's chat format) as `model_name`.
    `weights_token`: the bearer token `POST /v1/weights` needs (empty: loopback clients only). `api_token`: the
    bearer token every other route needs too (vLLM's `--api-key`; empty: none)."""
    created = int(time.time())
    gates: list[_Gate] = []  # made on the server's event loop, at its first use

    def gate() -> _Gate:
        if not gates:
            gates.append(_Gate(engine.policy_version if policy_version is None else policy_version))
        return gates[0]

    def sampling(body: dict, default_max: int) -> dict:
        return {"n": _number(body, "n", 1, 1, 64, int),
                "temperature": _number(body, "temperature", 1.0, 0, 2),
                "max_tokens": _number(body, "max_completion_tokens", None, 1, 32_768, int)
                or _number(body, "max_tokens", default_max, 1, 32_768, int),
                "seed": _number(body, "seed", None, -2**63, 2**63 - 1, int)}

    async def _body(request: Request) -> dict:
        try:
            body = await request.json()
        except ValueError:
            raise BadRequest("the body is not JSON") from None
        if not isinstance(body, dict):
            raise BadRequest("the body must be a JSON object")
        if body.get("model") not in (None, model_name):
            raise LookupError(f"this server serves {model_name!r}, not {body.get('model')!r}")
        return body

    def _request(prompt_ids: list[int], settings: dict, on_token=None) -> GenerationRequest:
        if engine.max_context and len(prompt_ids) >= engine.max_context:
            raise BadRequest(f"the prompt has {len(prompt_ids)} tokens; the model takes {engine.max_context}")
        budget = settings["max_tokens"] if not engine.max_context else \
            min(settings["max_tokens"], engine.max_context - len(prompt_ids))
        stop_ids = settings.get("stop_ids")
        return GenerationRequest(prompt_ids, settings["n"], budget, chat.stop_ids if stop_ids is None else stop_ids,
                                 settings["temperature"], settings["seed"], on_token=on_token)

    async def _generate(prompt_ids: list[int], settings: dict, on_token=None):
        # Awaited, not run on a thread: a thread per waiting request would cap the clients served at once at the
        # size of a thread pool (measured: time to first token grew to seconds at 16 clients on two cores).
        # Through the gate: a weight swap waits for what is in flight and holds the next ones back.
        await gate().enter()
        try:
            [future] = engine.submit([_request(prompt_ids, settings, on_token)])
            return await asyncio.wrap_future(future)
        finally:
            gate().leave()

    def _version(completions) -> int:
        """The oldest weights that wrote any of these answers."""
        return min((c.policy_version for c in completions), default=gate().version)

    def _logprobs(completion) -> dict:
        tokens = [chat.decode([token]) for token in completion.token_ids]
        return {"content": [{"token": text, "logprob": logprob, "bytes": list(text.encode()), "top_logprobs": []}
                            for text, logprob in zip(tokens, completion.logprobs, strict=True)]}

    def _refused(request: Request) -> JSONResponse | None:
        if api_token and not _bearer(request, api_token):
            return _error(401, "this server needs its bearer token", "authentication_error")
        return None

    async def models(request: Request):
        if refused := _refused(request):
            return refused
        return JSONResponse({"object": "list", "data": [{"id": model_name, "object": "model", "created": created,
                                                         "owned_by": "posttrain-studio"}]})

    async def chat_completions(request: Request):
        if refused := _refused(request):
            return refused
        try:
            body = await _body(request)
            messages = chat_messages(body.get("messages"))
            tools = [tool.get("function", tool) for tool in body.get("tools") or [] if isinstance(tool, dict)]
            settings = sampling(body, DEFAULT_MAX_TOKENS)
            prompt_ids = chat.prompt(messages, tools)
            _request(prompt_ids, settings)  # refused here, before a stream starts, if it cannot be served
        except BadRequest as exc:
            return _error(400, str(exc))
        except LookupError as exc:
            return _error(404, str(exc), "not_found_error")
        reply_id, now = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
        want_logprobs = bool(body.get("logprobs"))
        if body.get("stream"):
            return StreamingResponse(_stream(reply_id, now, prompt_ids, settings, want_logprobs,
                                             bool((body.get("stream_options") or {}).get("include_usage"))),
                                     media_type="text/event-stream")
        completions = await _generate(prompt_ids, settings)
        choices = []
        for index, completion in enumerate(completions):
            choice = {"index": index, "message": {"role": "assistant", "content": chat.decode(completion.token_ids)},
                      "finish_reason": completion.finish_reason, "logprobs": None}
            if want_logprobs:
                choice["logprobs"] = _logprobs(completion)
            if body.get("return_token_ids"):
                choice["token_ids"] = list(completion.token_ids)
            choices.append(choice)
        answer = {"id": reply_id, "object": "chat.completion", "created": now, "model": model_name,
                  "choices": choices, "usage": _usage(prompt_ids, completions), "policy_version": _version(completions)}
        if body.get("return_token_ids"):
            answer["prompt_token_ids"] = list(prompt_ids)
        return JSONResponse(answer)

    def _usage(prompt_ids, completions) -> dict:
        generated = sum(len(c.token_ids) for c in completions)
        return {"prompt_tokens": len(prompt_ids), "completion_tokens": generated,
                "total_tokens": len(prompt_ids) + generated}

    async def _stream(reply_id, now, prompt_ids, settings, want_logprobs, include_usage):
        """Server-sent chunks: each sample's new text as its tokens are sampled, then its finish reason."""
        loop = asyncio.get_running_loop()
        arrived: asyncio.Queue = asyncio.Queue()

        def on_token(slot: int, token: int) -> None:  # the engine's thread
            loop.call_soon_threadsafe(arrived.put_nowait, (slot, token))

        done = asyncio.ensure_future(_generate(prompt_ids, settings, on_token))
        head = {"id": reply_id, "object": "chat.completion.chunk", "created": now, "model": model_name}
        tokens = [[] for _ in range(settings["n"])]
        sent = [""] * settings["n"]

        def chunk(slot: int, delta: dict, finish=None, logprobs=None, **extra) -> str:
            return "data: " + json.dumps({**head, "choices": [{"index": slot, "delta": delta, "finish_reason": finish,
                                                                "logprobs": logprobs}], **extra}) + "\n\n"

        def new_text(slot: int, text: str):
            # Held back while it ends in a partly decoded character; sent once the character is whole.
            if text.endswith("\ufffd") or not text.startswith(sent[slot]) or text == sent[slot]:
                return None
            delta, sent[slot] = text[len(sent[slot]):], text
            return delta

        for slot in range(settings["n"]):
            yield chunk(slot, {"role": "assistant", "content": ""})
        while True:
            waiting = asyncio.ensure_future(arrived.get())
            finished, _ = await asyncio.wait({waiting, done}, return_when=asyncio.FIRST_COMPLETED)
            if waiting not in finished:
                waiting.cancel()
                break
            slot, token = waiting.result()
            tokens[slot].append(token)
            delta = new_text(slot, chat.decode(tokens[slot]))
            if delta:
                yield chunk(slot, {"content": delta})
        completions = await done
        for slot, completion in enumerate(completions):
            text = chat.decode(completion.token_ids)
            rest = text[len(sent[slot]):] if text.startswith(sent[slot]) else ""
            if rest:
                yield chunk(slot, {"content": rest})
            yield chunk(slot, {}, completion.finish_reason, _logprobs(completion) if want_logprobs else None,
                        policy_version=completion.policy_version)  # on each sample's last chunk
        if include_usage:
            yield f"data: {json.dumps({**head, 'choices': [], 'usage': _usage(prompt_ids, completions)})}\n\n"
        yield "data: [DONE]\n\n"

    async def completions(request: Request):
        if refused := _refused(request):
            return refused
        try:
            body = await _body(request)
            prompt = body.get("prompt")
            if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
                prompt_ids = list(prompt)
            elif isinstance(prompt, str) and prompt:
                tokenizer = chat.tokenizer  # a Hugging Face tokenizer is called; the character one encodes
                prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"] if callable(tokenizer) \
                    else tokenizer.encode(prompt)
            else:
                raise BadRequest("prompt must be text or a list of token ids")
            settings = sampling(body, 16)
            stop_ids = body.get("stop_token_ids")
            if stop_ids is not None:
                if not isinstance(stop_ids, list) or not all(isinstance(t, int) and not isinstance(t, bool)
                                                             for t in stop_ids):
                    raise BadRequest("stop_token_ids must be a list of token ids")
                settings["stop_ids"] = tuple(stop_ids)
            completions = await _generate(prompt_ids, settings)
        except BadRequest as exc:
            return _error(400, str(exc))
        except LookupError as exc:
            return _error(404, str(exc), "not_found_error")
        choices = []
        for index, completion in enumerate(completions):
            choice = {"index": index, "text": chat.decode(completion.token_ids),
                      "finish_reason": completion.finish_reason, "logprobs": None}
            if body.get("logprobs") is not None:
                choice["logprobs"] = {"tokens": [chat.decode([t]) for t in completion.token_ids],
                                      "token_logprobs": list(completion.logprobs), "top_logprobs": None,
                                      "text_offset": []}
            if body.get("return_token_ids"):
                choice["token_ids"] = list(completion.token_ids)
            choices.append(choice)
        answer = {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
                  "model": model_name, "choices": choices, "usage": _usage(prompt_ids, completions),
                  "policy_version": _version(completions)}
        if body.get("return_token_ids"):
            answer["prompt_token_ids"] = list(prompt_ids)
        return JSONResponse(answer)

    async def weights(request: Request):
        if request.method == "GET":
            return JSONResponse({"model": model_name, "policy_version": gate().version})
        if not may_load(request.headers.get("authorization", ""), request.client.host if request.client else None,
                        weights_token):
            return loading_refused(weights_token)
        try:
            location, version = await weights_request(request)
            try:  # read before anything pauses: a download must not hold requests back
                state = await asyncio.to_thread(read_weights, location)
            except (OSError, ValueError) as exc:
                raise BadRequest(f"could not read weights from {location}: {exc}") from None
            check_fits(engine, state)
        except BadRequest as exc:
            return _error(400, str(exc))

        async def load():
            engine.load_weights(state, version)

        paused = await swap_between_requests(gate(), load, version)
        return JSONResponse({"model": model_name, "policy_version": version, "paused_seconds": round(paused, 4)})

    return Starlette(routes=[Route("/v1/models", models), Route("/v1/chat/completions", chat_completions,
                                                                 methods=["POST"]),
                             Route("/v1/completions", completions, methods=["POST"]),
                             Route("/v1/weights", weights, methods=["GET", "POST"])])

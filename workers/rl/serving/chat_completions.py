"""`POST /v1/chat/completions`: the conversation rendered with the model's own chat format exactly as a rollout
renders it (`chat.prompt(messages, tools)`), so an evaluation through the server sees the prompts a direct
evaluation sees; answered whole, or streamed as server-sent events token by token as the engine samples them
(the torch and transformers engines call back per token; vLLM's engine hands back whole answers, so there the
first chunk comes with the last).

Tools: offered `tools` go to the chat format (its template's tool block), and the model's calls, written in the
Hermes convention it was trained on (`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, the studio's
one format: types.TOOL_CALL), come back as the API's `tool_calls` with `finish_reason: "tool_calls"`, the text
before the first call as `content` — as vLLM's hermes parser answers (a call that is not that JSON leaves the
whole text as content). `tool_choice` "auto" (the default with tools) and "none" (tools neither shown nor
parsed) are honoured; "required" and a named function need constrained decoding, which this server does not
do: refused with a 400. Streamed with tools, the answer comes whole in the last chunks (a call cannot be told
from text until it is complete). Assistant turns that carry `tool_calls` without the call in their text get it
written in the Hermes convention, and `tool` turns answer them, so a conversation continues after a call."""

from __future__ import annotations

import asyncio
import json
import time
import uuid

from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse

from ..types import TOOL_CALL
from .answers import answer, chat_logprobs, prompt_logprobs
from .parameters import refuse_unhonoured
from .served_model import ServedModel, read_number
from .weight_sync import BadRequest, error_response

DEFAULT_MAX_TOKENS = 256
MAX_LOGPROBS = 20  # alternatives per token (OpenAI's bound, and vLLM's default --max-logprobs)


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


def tool_calls_in(text: str) -> tuple[str | None, list[dict]]:
    """(content, the API's tool_calls) of an answer: the Hermes calls in it, the text before the first one as the
    content (None when empty); no calls (all of it content) when any block is not a call's JSON."""
    calls = []
    for block in TOOL_CALL.findall(text):
        try:
            data = json.loads(block)
        except ValueError:
            return text, []
        if not isinstance(data, dict) or not isinstance(data.get("name"), str) or \
                not isinstance(data.get("arguments", {}), dict):
            return text, []
        calls.append({"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                      "function": {"name": data["name"], "arguments": json.dumps(data.get("arguments", {}))}})
    if not calls:
        return text, []
    content = text[:text.index("<tool_call>")].strip()
    return content or None, calls


def offered_tools(body: dict) -> tuple[list[dict], bool]:
    """(the functions to show the model, whether to parse its calls) from `tools` and `tool_choice`."""
    tools = body.get("tools") or []
    if not isinstance(tools, list) or not all(isinstance(t, dict) and t.get("type", "function") == "function"
                                              and isinstance(t.get("function"), dict)
                                              and isinstance(t["function"].get("name"), str) for t in tools):
        raise BadRequest('tools must be a list of {"type": "function", "function": {"name": ..., ...}}')
    choice = body.get("tool_choice")
    if choice is not None and not tools and choice != "none":
        raise BadRequest("tool_choice needs tools")
    if choice == "none" or not tools:
        return [], False
    if choice not in (None, "auto"):
        raise BadRequest(f"tool_choice {json.dumps(choice)} is not supported: this server does not constrain "
                         'decoding to force a call; use "auto" (the default) or "none"')
    return [tool["function"] for tool in tools], True


def chat_completions(served: ServedModel):
    """The route's handler for `served`."""

    async def endpoint(request: Request):
        if refused := served.refused(request):
            return refused
        try:
            body = await served.read_body(request)
            refuse_unhonoured(body, chat=True)
            messages = chat_messages(body.get("messages"))
            tools, parse_calls = offered_tools(body)
            settings = served.sampling(body, DEFAULT_MAX_TOKENS)
            top = read_number(body, "top_logprobs", None, 0, MAX_LOGPROBS, int)
            if top and not body.get("logprobs"):  # as vLLM checks it
                raise BadRequest("top_logprobs needs logprobs: true")
            settings["top_logprobs"] = top or 0
            settings["prompt_logprobs"] = read_number(body, "prompt_logprobs", None, 0, MAX_LOGPROBS, int)
            if settings["prompt_logprobs"] is not None and body.get("stream"):
                raise BadRequest("prompt_logprobs are not available when streaming", param="prompt_logprobs")
            prompt_ids = served.chat.prompt(messages, tools)
            served.generation_request(prompt_ids, settings)  # refused now, before a stream starts, if unservable
        except BadRequest as exc:
            return error_response(400, str(exc), param=exc.param)
        except LookupError as exc:
            return error_response(404, str(exc), "not_found_error")
        reply_id, now = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
        want_logprobs = bool(body.get("logprobs"))
        if body.get("stream"):
            return StreamingResponse(_stream(served, reply_id, now, prompt_ids, settings, want_logprobs,
                                             bool((body.get("stream_options") or {}).get("include_usage")),
                                             parse_calls),
                                     media_type="text/event-stream")
        try:
            completions = await served.generate(prompt_ids, settings)
        except BadRequest as exc:
            return error_response(400, str(exc), param=exc.param)
        choices, generated = [], 0
        for index, completion in enumerate(completions):
            said = answer(served, completion, settings["stop"])
            generated += said.generated
            content, calls = tool_calls_in(said.text) if parse_calls else (said.text, [])
            message = {"role": "assistant", "content": content}
            if calls:
                message["tool_calls"] = calls
            choice = {"index": index, "message": message,
                      "finish_reason": "tool_calls" if calls else said.finish_reason, "logprobs": None}
            if want_logprobs:
                choice["logprobs"] = chat_logprobs(served, said.token_ids, said.logprobs, said.top_logprobs)
            if body.get("return_token_ids"):
                choice["token_ids"] = said.token_ids
            choices.append(choice)
        answer_body = {"id": reply_id, "object": "chat.completion", "created": now, "model": served.model_name,
                       "choices": choices, "usage": served.usage(len(prompt_ids), generated),
                       "policy_version": served.version_of(completions)}
        if settings["prompt_logprobs"] is not None:  # vLLM's field, at the top level in chat
            answer_body["prompt_logprobs"] = prompt_logprobs(served, prompt_ids, completions[0].prompt_logprobs)
        if body.get("return_token_ids"):
            answer_body["prompt_token_ids"] = list(prompt_ids)
        return JSONResponse(answer_body)

    return endpoint


async def _stream(served: ServedModel, reply_id, now, prompt_ids, settings, want_logprobs, include_usage,
                  parse_calls):
    """Server-sent chunks: each sample's new text as its tokens are sampled, then its finish reason (with tools
    offered, the whole answer at the end: its content, then its calls)."""
    chat = served.chat
    loop = asyncio.get_running_loop()
    arrived: asyncio.Queue = asyncio.Queue()

    def on_token(slot: int, token: int) -> None:  # the engine's thread
        loop.call_soon_threadsafe(arrived.put_nowait, (slot, token))

    done = asyncio.ensure_future(served.generate(prompt_ids, settings, on_token))
    head = {"id": reply_id, "object": "chat.completion.chunk", "created": now, "model": served.model_name}
    tokens = [[] for _ in range(settings["n"])]
    sent = [""] * settings["n"]

    def chunk(slot: int, delta: dict, finish=None, logprobs=None, **extra) -> str:
        return "data: " + json.dumps({**head, "choices": [{"index": slot, "delta": delta, "finish_reason": finish,
                                                            "logprobs": logprobs}], **extra}) + "\n\n"

    # With stop strings, the text's last characters wait until no stop string can begin in them, and text from a
    # stop string on is never sent (the answer's end comes with its finish).
    stops = settings["stop"]
    held = max(map(len, stops), default=1) - 1

    def new_text(slot: int, text: str):
        # Held back while it ends in a partly decoded character; sent once the character is whole.
        if stops:
            cut = min((i for i in (text.find(stop) for stop in stops) if i >= 0), default=len(text) - held)
            text = text[:cut]
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
        delta = None if parse_calls else new_text(slot, chat.decode(tokens[slot]))
        if delta:
            yield chunk(slot, {"content": delta})
    completions, generated = await done, 0
    for slot, completion in enumerate(completions):
        said = answer(served, completion, settings["stop"])
        generated += said.generated
        content, calls = tool_calls_in(said.text) if parse_calls else (said.text, [])
        rest = (content or "")[len(sent[slot]):] if (content or "").startswith(sent[slot]) else ""
        if rest:
            yield chunk(slot, {"content": rest})
        if calls:
            yield chunk(slot, {"tool_calls": [{"index": number, **call} for number, call in enumerate(calls)]})
        logprobs = chat_logprobs(served, said.token_ids, said.logprobs, said.top_logprobs) if want_logprobs else None
        yield chunk(slot, {}, "tool_calls" if calls else said.finish_reason, logprobs,
                    policy_version=completion.policy_version)  # on each sample's last chunk
    if include_usage:
        usage = served.usage(len(prompt_ids), generated)
        yield f"data: {json.dumps({**head, 'choices': [], 'usage': usage})}\n\n"
    yield "data: [DONE]\n\n"

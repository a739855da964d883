"""`POST /v1/chat/completions`: the conversation rendered with the model's own chat format exactly as a rollout
renders it (`chat.prompt(messages, tools)`), so an evaluation through the server sees the prompts a direct
evaluation sees; answered whole, or streamed as server-sent events token by token as the engine samples them
(the torch and transformers engines call back per token; vLLM's engine hands back whole answers, so there the
first chunk comes with the last). Assistant turns that carry `tool_calls` without the call in their text get it
written in the Hermes convention the model was trained to write."""

from __future__ import annotations

import asyncio
import json
import time
import uuid

from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse

from .served_model import ServedModel
from .weight_sync import BadRequest, error_response

DEFAULT_MAX_TOKENS = 256


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


def chat_completions(served: ServedModel):
    """The route's handler for `served`."""

    async def endpoint(request: Request):
        if refused := served.refused(request):
            return refused
        try:
            body = await served.read_body(request)
            messages = chat_messages(body.get("messages"))
            tools = [tool.get("function", tool) for tool in body.get("tools") or [] if isinstance(tool, dict)]
            settings = served.sampling(body, DEFAULT_MAX_TOKENS)
            prompt_ids = served.chat.prompt(messages, tools)
            served.generation_request(prompt_ids, settings)  # refused now, before a stream starts, if unservable
        except BadRequest as exc:
            return error_response(400, str(exc))
        except LookupError as exc:
            return error_response(404, str(exc), "not_found_error")
        reply_id, now = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
        want_logprobs = bool(body.get("logprobs"))
        if body.get("stream"):
            return StreamingResponse(_stream(served, reply_id, now, prompt_ids, settings, want_logprobs,
                                             bool((body.get("stream_options") or {}).get("include_usage"))),
                                     media_type="text/event-stream")
        completions = await served.generate(prompt_ids, settings)
        choices = []
        for index, completion in enumerate(completions):
            choice = {"index": index,
                      "message": {"role": "assistant", "content": served.chat.decode(completion.token_ids)},
                      "finish_reason": completion.finish_reason, "logprobs": None}
            if want_logprobs:
                choice["logprobs"] = _logprobs(served, completion)
            if body.get("return_token_ids"):
                choice["token_ids"] = list(completion.token_ids)
            choices.append(choice)
        answer = {"id": reply_id, "object": "chat.completion", "created": now, "model": served.model_name,
                  "choices": choices, "usage": served.usage(prompt_ids, completions),
                  "policy_version": served.version_of(completions)}
        if body.get("return_token_ids"):
            answer["prompt_token_ids"] = list(prompt_ids)
        return JSONResponse(answer)

    return endpoint


def _logprobs(served: ServedModel, completion) -> dict:
    tokens = [served.chat.decode([token]) for token in completion.token_ids]
    return {"content": [{"token": text, "logprob": logprob, "bytes": list(text.encode()), "top_logprobs": []}
                        for text, logprob in zip(tokens, completion.logprobs, strict=True)]}


async def _stream(served: ServedModel, reply_id, now, prompt_ids, settings, want_logprobs, include_usage):
    """Server-sent chunks: each sample's new text as its tokens are sampled, then its finish reason."""
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
        yield chunk(slot, {}, completion.finish_reason, _logprobs(served, completion) if want_logprobs else None,
                    policy_version=completion.policy_version)  # on each sample's last chunk
    if include_usage:
        yield f"data: {json.dumps({**head, 'choices': [], 'usage': served.usage(prompt_ids, completions)})}\n\n"
    yield "data: [DONE]\n\n"

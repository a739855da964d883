"""An engine behind any OpenAI-compatible chat completions API: a hosted model, a vLLM server, or the studio's
own `manage.py serve` of a checkpoint. Evaluation rolls out through it with the same agent loop as a local
model (tool calls run in the studio's sandboxes), so a score of an endpoint and a score of a checkpoint come
from the same machinery.

The conversation goes as messages, the standard way: an assistant turn that called tools carries `tool_calls`
(with the ids of the tool turns that answer them) beside its raw text, and a model that answers with native
`tool_calls` has them written back into the text in the Hermes convention the studio parses
(`<tool_call>{"name": ..., "arguments": ...}</tool_call>`), so one parser serves both.

The base URL is an editor's: the client reaches only what the egress policy allows (workers/egress.py), checked
when the engine is built (a refusal fails the evaluation with its reason) and on every connection it makes.

Failures are the infrastructure's, never the model's: a timeout, a 5xx, a 429 or an answer that is not the API's
JSON is retried (the client's retries with backoff, then ours), and what still fails comes back as a completion
with finish_reason "error", which the agent records as an infrastructure error: never scored as wrong.
"""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import openai

from workers.definitions.newlines import normalise_newlines
from workers.egress import PUBLIC_ONLY, EgressPolicy, egress_client, refused_cause

from ..types import TOOL_CALL
from . import Completion, GenerationRequest


def openai_messages(messages: tuple[dict, ...] | list[dict]) -> list[dict]:
    """The agent's messages as the chat completions API takes them."""
    out: list[dict] = []
    pending: list[dict] = []  # tool turns still to come for the last assistant turn's calls
    answered = [m for m in messages if m["role"] == "tool"]
    answer_ids = iter([m.get("tool_call_id", f"call-{i}") for i, m in enumerate(answered)])
    for message in messages:
        role = message["role"]
        if role == "assistant":
            entry = {"role": "assistant", "content": message.get("content", "")}
            calls = []
            for block in TOOL_CALL.findall(entry["content"] or ""):
                try:
                    data = json.loads(block)
                    calls.append({"id": next(answer_ids), "type": "function",
                                  "function": {"name": str(data.get("name", "")),
                                               "arguments": json.dumps(data.get("arguments", {}))}})
                except (ValueError, StopIteration, AttributeError):
                    break  # a malformed call ended the sample: nothing answers it
            if calls:
                entry["tool_calls"] = calls
            pending = calls
            out.append(entry)
        elif role == "tool":
            out.append({"role": "tool", "tool_call_id": message.get("tool_call_id") or
                        (pending[0]["id"] if pending else ""), "content": message.get("content", "")})
        else:
            out.append({"role": role, "content": message.get("content", "")})
    return out


def _text(choice) -> str:
    """The answer's text with "\n" line endings (a model may write "\r\n"; the studio's parsers and the replay
    read "\n"), native tool calls written in the Hermes convention when the text lacks them."""
    text = normalise_newlines(choice.message.content or "")
    calls = getattr(choice.message, "tool_calls", None) or []
    if calls and "<tool_call>" not in text:
        for call in calls:
            try:
                arguments = json.loads(call.function.arguments or "{}")
            except ValueError:
                arguments = call.function.arguments  # left for the parser to refuse as the policy's error
            text += "\n<tool_call>\n" + json.dumps({"name": call.function.name, "arguments": arguments}) + \
                "\n</tool_call>"
    return text


class EndpointEngine:
    """`generate` as the agent calls it, one chat completion per request (its `n` samples in one call)."""

    name = "endpoint"
    max_context: int | None = None  # the server's business: it refuses or truncates what does not fit
    shares_weights = False

    def __init__(self, *, base_url: str, model: str, api_key: str = "", timeout_seconds: float = 60.0,
                 client_retries: int = 2, retries: int = 1, max_concurrency: int = 8, policy_version: int = 0,
                 egress: EgressPolicy = PUBLIC_ONLY):
        egress.check_url(base_url)  # EgressRefused: before any request leaves
        self.model = model
        self.policy_version = policy_version
        self.busy_seconds = 0.0
        self.retries = retries
        self._client = openai.OpenAI(base_url=base_url, api_key=api_key or "none", timeout=timeout_seconds,
                                     max_retries=client_retries,
                                     http_client=egress_client(egress, timeout=timeout_seconds, follow_redirects=True))
        self._threads = ThreadPoolExecutor(max_workers=max_concurrency, thread_name_prefix="endpoint")
        self._lock = threading.Lock()

    def generate(self, requests: list[GenerationRequest]) -> list[list[Completion]]:
        return list(self._threads.map(self._complete, requests))

    def _complete(self, request: GenerationRequest) -> list[Completion]:
        arguments = {"model": self.model, "messages": openai_messages(request.messages), "n": request.n,
                     "temperature": request.temperature, "max_tokens": max(1, request.max_new_tokens)}
        if request.seed is not None:
            arguments["seed"] = request.seed
        if request.tools:
            arguments["tools"] = [{"type": "function", "function": tool} for tool in request.tools]
        error = ""
        for _ in range(1 + self.retries):
            started = time.monotonic()
            try:
                reply = self._client.chat.completions.create(**arguments)
                choices = sorted(reply.choices, key=lambda c: c.index)
                if len(choices) != request.n:
                    raise ValueError(f"asked for {request.n} answers, got {len(choices)}")
            except (openai.APIError, ValueError, TypeError, AttributeError) as exc:
                refused = refused_cause(exc)  # a redirect, or a name that resolves elsewhere now
                error = (f"EgressRefused: {refused}" if refused else f"{type(exc).__name__}: {exc}")[:500]
                if refused:
                    break
                continue
            seconds = time.monotonic() - started
            with self._lock:
                self.busy_seconds += seconds
            usage = getattr(reply, "usage", None)
            tokens = (usage.completion_tokens if usage and usage.completion_tokens is not None else 0) // request.n
            return [Completion(token_ids=[], logprobs=[], text=_text(choice), usage_tokens=tokens,
                               finish_reason="length" if choice.finish_reason == "length" else "stop",
                               compute_seconds=seconds / request.n, policy_version=self.policy_version)
                    for choice in choices]
        return [Completion(token_ids=[], logprobs=[], finish_reason="error", error=error,
                           policy_version=self.policy_version) for _ in range(request.n)]

    def load_weights(self, state, version: int) -> None:
        raise RuntimeError("an endpoint's weights are the server's: it cannot load the trainer's")

    def close(self) -> None:
        self._threads.shutdown(wait=False, cancel_futures=True)
        self._client.close()


class MessagesChat:
    """The chat format for an endpoint: the server applies its own template, so nothing is tokenised here."""

    stop_ids: tuple[int, ...] = ()

    def prompt(self, messages: list[dict], tools: list[dict]) -> list[int]:
        return []

    def continuation(self, messages: list[dict], new: list[dict], tools: list[dict]) -> list[int]:
        return []

    def decode(self, ids: list[int]) -> str:
        return ""

"""vLLM's tokenizer routes, at the server's root as vLLM serves them: `POST /tokenize`, `POST /detokenize` and
`GET /tokenizer_info`. lm-evaluation-harness's API models use them (`tokenizer_backend=remote`, what its
`local-completions` picks by itself when /tokenizer_info and /tokenize answer) to count a loglikelihood request's
context tokens with the served model's own tokenizer, so a model whose tokenizer a client cannot load — the
studio's character model, a checkpoint on another machine — is scored as vLLM would score it.

- `/tokenize` `{"prompt": text, "add_special_tokens": bool}` or `{"messages": [...], "tools": [...]}` (the chat
  format's prompt, generation prompt included) -> `{"count", "max_model_len", "tokens"}` (and `"token_strs"`
  asked with `return_token_strs`);
- `/detokenize` `{"tokens": [ids]}` -> `{"prompt": text}`;
- `/tokenizer_info` -> the tokenizer's class, its eos/bos/pad tokens, chat template and length.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse

from .chat_completions import chat_messages
from .served_model import ServedModel
from .weight_sync import BadRequest, error_response


def _hugging_face(served: ServedModel):
    """The Hugging Face tokenizer behind the chat format, or None (the character model's own tokenizer)."""
    tokenizer = served.chat.tokenizer
    return tokenizer if callable(tokenizer) else None


def _max_model_len(served: ServedModel) -> int | None:
    return served.engine.max_context or None


def tokenize(served: ServedModel):
    async def endpoint(request: Request):
        if refused := served.refused(request):
            return refused
        try:
            body = await served.read_body(request)
            hugging_face = _hugging_face(served)
            if "messages" in body:
                tools = [t.get("function", t) for t in body.get("tools") or [] if isinstance(t, dict)]
                tokens = list(served.chat.prompt(chat_messages(body["messages"]), tools))
            elif isinstance(body.get("prompt"), str):
                special = body.get("add_special_tokens", True)
                if not isinstance(special, bool):
                    raise BadRequest("add_special_tokens must be true or false")
                tokens = list(hugging_face(body["prompt"], add_special_tokens=special)["input_ids"]) \
                    if hugging_face is not None else served.encode(body["prompt"])
            else:
                raise BadRequest("send prompt (text) or messages")
        except BadRequest as exc:
            return error_response(400, str(exc))
        except LookupError as exc:
            return error_response(404, str(exc), "not_found_error")
        answer = {"count": len(tokens), "max_model_len": _max_model_len(served), "tokens": tokens}
        if body.get("return_token_strs"):
            answer["token_strs"] = [served.token_text(t) for t in tokens]
        return JSONResponse(answer)

    return endpoint


def detokenize(served: ServedModel):
    async def endpoint(request: Request):
        if refused := served.refused(request):
            return refused
        try:
            body = await served.read_body(request)
            tokens = body.get("tokens")
            size = served.vocabulary_size
            if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool)
                                                       and 0 <= t < size for t in tokens):
                raise BadRequest(f"tokens must be a list of token ids (0 to {size - 1})")
        except BadRequest as exc:
            return error_response(400, str(exc))
        except LookupError as exc:
            return error_response(404, str(exc), "not_found_error")
        return JSONResponse({"prompt": served.chat.tokenizer.decode(tokens)})

    return endpoint


def tokenizer_info(served: ServedModel):
    async def endpoint(request: Request):
        if refused := served.refused(request):
            return refused
        hugging_face = _hugging_face(served)
        if hugging_face is not None:
            info = {"tokenizer_class": type(hugging_face).__name__, "eos_token": hugging_face.eos_token,
                    "bos_token": hugging_face.bos_token, "pad_token": hugging_face.pad_token,
                    "chat_template": hugging_face.chat_template}
        else:  # the character model: its end of turn is its end of sequence; it has no begin or pad token
            info = {"tokenizer_class": type(served.chat.tokenizer).__name__,
                    "eos_token": served.token_text(served.chat.stop_ids[0]), "bos_token": None, "pad_token": None,
                    "chat_template": None}
        return JSONResponse({**info, "model_max_length": _max_model_len(served),
                             "vocab_size": served.vocabulary_size})

    return endpoint

"""`POST /v1/completions`: a prompt of text or of token ids (vLLM's form, as the `server` engine sends its
rollouts), `stop_token_ids` (vLLM's name; default: the chat format's stop ids), with logprobs and, asked with
`"return_token_ids": true`, the ids themselves."""

from __future__ import annotations

import time
import uuid

from starlette.requests import Request
from starlette.responses import JSONResponse

from .served_model import ServedModel
from .weight_sync import BadRequest, error_response

DEFAULT_MAX_TOKENS = 16  # OpenAI's default for this route


def completions(served: ServedModel):
    """The route's handler for `served`."""
    chat = served.chat

    async def endpoint(request: Request):
        if refused := served.refused(request):
            return refused
        try:
            body = await served.read_body(request)
            prompt = body.get("prompt")
            if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
                prompt_ids = list(prompt)
            elif isinstance(prompt, str) and prompt:
                tokenizer = chat.tokenizer  # a Hugging Face tokenizer is called; the character one encodes
                prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"] if callable(tokenizer) \
                    else tokenizer.encode(prompt)
            else:
                raise BadRequest("prompt must be text or a list of token ids")
            settings = served.sampling(body, DEFAULT_MAX_TOKENS)
            stop_ids = body.get("stop_token_ids")
            if stop_ids is not None:
                if not isinstance(stop_ids, list) or not all(isinstance(t, int) and not isinstance(t, bool)
                                                             for t in stop_ids):
                    raise BadRequest("stop_token_ids must be a list of token ids")
                settings["stop_ids"] = tuple(stop_ids)
            answers = await served.generate(prompt_ids, settings)
        except BadRequest as exc:
            return error_response(400, str(exc))
        except LookupError as exc:
            return error_response(404, str(exc), "not_found_error")
        choices = []
        for index, completion in enumerate(answers):
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
                  "model": served.model_name, "choices": choices, "usage": served.usage(prompt_ids, answers),
                  "policy_version": served.version_of(answers)}
        if body.get("return_token_ids"):
            answer["prompt_token_ids"] = list(prompt_ids)
        return JSONResponse(answer)

    return endpoint

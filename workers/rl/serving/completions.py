"""`POST /v1/completions`: the OpenAI API's legacy completions, as lm-evaluation-harness and vLLM's clients use
them. The prompt is text, token ids (vLLM's form, as the `server` engine sends its rollouts), or a list of either
(a batch: one choice per prompt and sample, `index` = prompt × n + sample, as the API numbers them). `echo`
puts the prompt before the answer, in the text and in the logprobs (its first token's logprob null); with
`max_tokens: 0` nothing is generated — the prompt's own logprobs, how lm-evaluation-harness scores
loglikelihoods. `logprobs: k` answers each token with its k likeliest alternatives; `prompt_logprobs: k` is
vLLM's per-prompt-token field. `stop_token_ids` (vLLM's name; default: the chat format's stop ids) and,
asked with `"return_token_ids": true`, the ids themselves."""

from __future__ import annotations

import time
import uuid

from starlette.requests import Request
from starlette.responses import JSONResponse

from .answers import answer, completion_logprobs, prompt_logprobs
from .parameters import refuse_unhonoured
from .served_model import ServedModel, read_number
from .weight_sync import BadRequest, error_response

DEFAULT_MAX_TOKENS = 16  # OpenAI's default for this route
MAX_LOGPROBS = 20  # alternatives per token (vLLM's default --max-logprobs)
# choices one request may ask for (prompts × n): the engine holds them all at once, with their logprobs.
# vLLM sets no such bound; lm-evaluation-harness sends its batch_size prompts with n 1.
MAX_CHOICES = 1024


def prompts_of(served: ServedModel, prompt) -> list[list[int]]:
    """The request's prompts as token ids: text, token ids, or a non-empty list of either."""
    if isinstance(prompt, str):
        prompts = [prompt]
    elif isinstance(prompt, list) and prompt and all(_is_id(t) for t in prompt):
        prompts = [prompt]
    elif isinstance(prompt, list) and prompt and (all(isinstance(p, str) for p in prompt)
                                                  or all(isinstance(p, list) and all(map(_is_id, p)) for p in prompt)):
        prompts = prompt
    else:
        raise BadRequest("prompt must be text, a list of token ids, or a list of either")
    out, vocabulary = [], served.vocabulary_size
    for index, one in enumerate(prompts):
        ids = served.encode(one) if isinstance(one, str) else list(one)
        if not ids:
            raise BadRequest(f"prompt {index} is empty")
        if not all(0 <= t < vocabulary for t in ids):
            raise BadRequest(f"prompt {index} holds a token id outside the vocabulary (0 to {vocabulary - 1})")
        out.append(ids)
    return out


def _is_id(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def completions(served: ServedModel):
    """The route's handler for `served`."""

    async def endpoint(request: Request):
        if refused := served.refused(request):
            return refused
        try:
            body = await served.read_body(request)
            refuse_unhonoured(body, chat=False)
            prompts = prompts_of(served, body.get("prompt"))
            settings = served.sampling(body, DEFAULT_MAX_TOKENS, least_tokens=0)
            if len(prompts) * settings["n"] > MAX_CHOICES:
                raise BadRequest(f"{len(prompts)} prompts × n {settings['n']} ask for more than {MAX_CHOICES} "
                                 "choices; send fewer at a time", param="prompt")
            echo = bool(body.get("echo"))
            top = read_number(body, "logprobs", None, 0, MAX_LOGPROBS, int)
            scored = read_number(body, "prompt_logprobs", None, 0, MAX_LOGPROBS, int)
            settings["top_logprobs"] = top or 0
            if (echo and top is not None) or scored is not None:
                settings["prompt_logprobs"] = max(top or 0, scored or 0)
            stop_ids = body.get("stop_token_ids")
            if stop_ids is not None:
                if not isinstance(stop_ids, list) or not all(map(_is_id, stop_ids)):
                    raise BadRequest("stop_token_ids must be a list of token ids")
                settings["stop_ids"] = tuple(stop_ids)
            groups = await served.generate_many(prompts, settings)
        except BadRequest as exc:
            return error_response(400, str(exc), param=exc.param)
        except LookupError as exc:
            return error_response(404, str(exc), "not_found_error")
        choices, generated = [], 0
        for number, (prompt_ids, group) in enumerate(zip(prompts, groups, strict=True)):
            for sample, completion in enumerate(group):
                said = answer(served, completion, settings["stop"])
                generated += said.generated
                choice = {"index": number * settings["n"] + sample,
                          "text": (served.chat.decode(prompt_ids) if echo else "") + said.text,
                          "finish_reason": said.finish_reason, "logprobs": None}
                if top is not None:
                    ids, logprobs = said.token_ids, said.logprobs
                    alternatives = said.top_logprobs or [None] * len(ids)
                    if echo:  # the prompt's tokens first, scored by the model (the first one: nothing before it)
                        ids = prompt_ids + ids
                        logprobs = [s and s[0] for s in completion.prompt_logprobs] + logprobs
                        alternatives = [s and s[2] for s in completion.prompt_logprobs] + alternatives
                    choice["logprobs"] = completion_logprobs(served, ids, logprobs, alternatives, top)
                if scored is not None:
                    choice["prompt_logprobs"] = prompt_logprobs(served, prompt_ids, completion.prompt_logprobs)
                if body.get("return_token_ids"):
                    choice["token_ids"] = said.token_ids
                    choice["prompt_token_ids"] = list(prompt_ids)
                choices.append(choice)
        answer_body = {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
                       "model": served.model_name, "choices": choices,
                       "usage": served.usage(sum(map(len, prompts)), generated),
                       "policy_version": served.version_of([c for group in groups for c in group])}
        if body.get("return_token_ids") and len(prompts) == 1:
            answer_body["prompt_token_ids"] = list(prompts[0])
        return JSONResponse(answer_body)

    return endpoint

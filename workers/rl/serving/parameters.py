"""The request parameters `serve` does not honour, and what it does with them. vLLM's rule for the rest: a
parameter that neither it nor this server knows is accepted and ignored (vLLM logs it; clients send their own
extras). A parameter vLLM or the OpenAI API would honour — it changes the answer — and this server does not is
refused with a 400 that names it, unless it is at its no-op value (clients often send `top_p: 1` explicitly):
never silently dropped. The README's "OpenAI API support" table lists both sides."""

from __future__ import annotations

import json

from .weight_sync import BadRequest


def _off(value) -> bool:
    return value is None or value is False or value == [] or value == {} or value == ""


# name -> whether the value asks for nothing (the parameter's no-op), on both routes
UNHONOURED = {
    "top_p": lambda v: v is None or v == 1,
    "top_k": lambda v: v is None or v in (0, -1),
    "min_p": lambda v: v is None or v == 0,
    "repetition_penalty": lambda v: v is None or v == 1,
    "length_penalty": lambda v: v is None or v == 1,
    "logit_bias": _off,
    "use_beam_search": _off,
    "ignore_eos": _off,
    "min_tokens": lambda v: v is None or v == 0,
    "include_stop_str_in_output": _off,
    "truncate_prompt_tokens": _off,
    "allowed_token_ids": _off,
    "bad_words": _off,
    "guided_json": _off,
    "guided_regex": _off,
    "guided_choice": _off,
    "guided_grammar": _off,
    "structural_tag": _off,
    "logits_processors": _off,
    "return_tokens_as_token_ids": _off,
    "prompt_embeds": _off,
    "vllm_xargs": _off,
    "priority": lambda v: v is None or v == 0,
}
# chat only: vLLM's template switches, and its chat `echo` (the last message prepended to the answer)
UNHONOURED_IN_CHAT = {
    "echo": _off,
    "continue_final_message": _off,
    "add_generation_prompt": lambda v: v is None or v is True,
    "chat_template": _off,
    "chat_template_kwargs": _off,
    "documents": _off,
}
# completions only
UNHONOURED_IN_COMPLETIONS = {
    "suffix": _off,
    "stream": _off,  # chat streams; lm-evaluation-harness and vLLM's clients read completions whole
}


def refuse_unhonoured(body: dict, *, chat: bool) -> None:
    """BadRequest naming the first parameter this server would not honour; the response format too."""
    table = {**UNHONOURED, **(UNHONOURED_IN_CHAT if chat else UNHONOURED_IN_COMPLETIONS)}
    for name, harmless in table.items():
        if name in body and not harmless(body[name]):
            raise BadRequest(f"{name} is not supported by this server (it would change the answer, so it is "
                             f"refused rather than ignored); leave it out", param=name)
    if "best_of" in body and body["best_of"] not in (None, 1, body.get("n", 1)):
        raise BadRequest("best_of is not supported by this server; leave it out or equal to n", param="best_of")
    response_format = body.get("response_format")
    if response_format is None:
        return
    kind = response_format.get("type") if isinstance(response_format, dict) else None
    if kind != "text":
        raise BadRequest(f"response_format {json.dumps(kind)} is not supported: this server does not constrain "
                         'decoding to JSON (vLLM\'s guided decoding does); send {"type": "text"} or leave it out '
                         "and parse the answer", param="response_format")

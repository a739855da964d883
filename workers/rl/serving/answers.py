"""What an engine's completion becomes in the OpenAI API, for both generation routes: the answer cut before its
first stop string (the stop text not included, as the API does), and its logprobs in the API's two shapes — the
legacy completions' (`tokens`, `token_logprobs`, `top_logprobs` dicts, `text_offset`) and chat's (`content`
entries with `bytes` and `top_logprobs` lists) — plus vLLM's `prompt_logprobs`."""

from __future__ import annotations

from dataclasses import dataclass

# The API's floor for a logprob in JSON (vLLM's too): -inf is not JSON.
LOGPROB_FLOOR = -9999.0


@dataclass
class Answer:
    """One sample as the API shows it."""

    text: str
    token_ids: list[int]
    logprobs: list[float]
    top_logprobs: list[list[tuple[int, float]]] | None
    finish_reason: str
    generated: int  # tokens the engine sampled, a stop string's too (the usage; vLLM counts them alike)


def stop_checker(decode, stops: tuple[str, ...]):
    """engines.GenerationRequest.stop_check for stop strings: whether the text of a sample's last tokens holds
    one. A stop string of L characters ends within the last L tokens (each writes at least a character, but for
    the pieces of a character split over byte tokens, which the margin covers)."""
    window = max(len(stop) for stop in stops) + 8

    def check(tokens: list[int]) -> bool:
        tail = decode(tokens[-window:])
        return any(stop in tail for stop in stops)

    return check


def answer(served, completion, stops: tuple[str, ...]) -> Answer:
    """`completion` cut before the first of `stops` in its text; its finish reason then "stop"."""
    text = served.chat.decode(completion.token_ids)
    ids, logprobs, top, reason = (list(completion.token_ids), list(completion.logprobs), completion.top_logprobs,
                                  completion.finish_reason)
    cut = min((index for index in (text.find(stop) for stop in stops) if index >= 0), default=-1)
    if cut >= 0:
        text, reason = text[:cut], "stop"
        # The tokens that wrote at least a character of what is kept (their own texts laid end to end).
        keep, offset = 0, 0
        while keep < len(ids) and offset < cut:
            offset += len(served.token_text(ids[keep]))
            keep += 1
        ids, logprobs, top = ids[:keep], logprobs[:keep], None if top is None else top[:keep]
    return Answer(text, ids, logprobs, top, reason, len(completion.token_ids))


def _floor(logprob: float) -> float:
    return max(logprob, LOGPROB_FLOOR)


def completion_logprobs(served, ids: list[int], logprobs: list, top: list | None, k: int) -> dict:
    """The legacy completions' logprobs of these tokens: `logprobs` one per id (None where nothing is known: a
    prompt's first token); `top` per token its alternatives [(id, logprob)] (None: only the token itself). Each
    `top_logprobs` dict holds the token itself and its `k` likeliest alternatives, as vLLM answers it;
    `text_offset` is where each token starts in the choice's text."""
    tokens = [served.token_text(token) for token in ids]
    offsets, offset = [], 0
    for token in tokens:
        offsets.append(offset)
        offset += len(token)
    tops = []
    for token, logprob, alternatives in zip(tokens, logprobs, top or [None] * len(ids), strict=True):
        if logprob is None:
            tops.append(None)
            continue
        entry = {served.token_text(other): _floor(value) for other, value in (alternatives or [])[:k]}
        entry[token] = _floor(logprob)
        tops.append(entry)
    return {"tokens": tokens, "token_logprobs": [None if value is None else _floor(value) for value in logprobs],
            "top_logprobs": tops, "text_offset": offsets}


def chat_logprobs(served, ids: list[int], logprobs: list[float], top: list | None) -> dict:
    """Chat's logprobs: per token its text, logprob, UTF-8 bytes and its alternatives in the same shape."""

    def one(token: int, logprob: float) -> dict:
        text = served.token_text(token)
        return {"token": text, "logprob": _floor(logprob), "bytes": list(text.encode("utf-8", "replace"))}

    return {"content": [{**one(token, logprob), "top_logprobs": [one(o, v) for o, v in alternatives or ()]}
                        for token, logprob, alternatives in zip(ids, logprobs, top or [None] * len(ids),
                                                                strict=True)],
            "refusal": None}


def prompt_logprobs(served, prompt_ids: list[int], scored: list) -> list:
    """vLLM's `prompt_logprobs`: per prompt token None for the first, then {token id: {logprob, rank,
    decoded_token}} of the token itself and the alternatives asked for."""
    out = []
    for token, position in zip(prompt_ids, scored, strict=True):
        if position is None:
            out.append(None)
            continue
        logprob, rank, alternatives = position
        entry = {str(other): {"logprob": _floor(value), "rank": place, "decoded_token": served.token_text(other)}
                 for place, (other, value) in enumerate(alternatives, start=1)}
        entry[str(token)] = {"logprob": _floor(logprob), "rank": rank, "decoded_token": served.token_text(token)}
        out.append(entry)
    return out

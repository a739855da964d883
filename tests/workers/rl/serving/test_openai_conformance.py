"""`serve` answers as the OpenAI API does where the field's tools rely on it, checked through the official `openai`
client against the real app on the tiny model: logprobs with their alternatives, the prompt's own logprobs
(lm-evaluation-harness's loglikelihood scoring), prompt lists and n, stop strings, seeds, penalties, tools,
response formats, and errors in the API's shape."""

import math

import openai
import pytest
import torch
from torch.nn import functional as F

from workers.rl.models.chat_formats import CharTokenizer

TOKENS = CharTokenizer()


@pytest.fixture
def client(served):
    return openai.OpenAI(base_url=served, api_key="unused", max_retries=0)


def model_logprobs(model, text: str) -> list[float]:
    """Each token's logprob after the ones before it, straight from the model (the first: none)."""
    ids = TOKENS.encode(text)
    with torch.no_grad():
        logits, _ = model(torch.tensor([ids]))
    distribution = F.log_softmax(logits[0, :-1].float(), dim=-1)
    return distribution.gather(1, torch.tensor(ids[1:])[:, None]).squeeze(1).tolist()


def test_chat_top_logprobs_are_the_k_likeliest_with_bytes(client):
    """Issue 30's first request: `top_logprobs: 2` answered with two alternatives per token, not []."""
    reply = client.chat.completions.create(model="tiny-adder", messages=[{"role": "user", "content": "3+4="}],
                                           temperature=0, max_tokens=3, logprobs=True, top_logprobs=2)
    entries = reply.choices[0].logprobs.content
    assert entries
    for entry in entries:
        assert len(entry.top_logprobs) == 2
        first, second = entry.top_logprobs
        assert first.logprob >= second.logprob
        assert first.token == entry.token and math.isclose(first.logprob, entry.logprob, abs_tol=1e-5)  # greedy
        assert entry.bytes == list(entry.token.encode()) and first.bytes == list(first.token.encode())
    with pytest.raises(openai.BadRequestError, match="top_logprobs needs logprobs"):
        client.chat.completions.create(model="tiny-adder", messages=[{"role": "user", "content": "3+4="}],
                                       max_tokens=1, top_logprobs=2)


def test_echo_with_no_new_tokens_scores_the_prompt(client, addition_base_model):
    """Issue 30's second request: lm-evaluation-harness's loglikelihood scoring, the prompt's own logprobs."""
    reply = client.completions.create(model="tiny-adder", prompt="3+4=7", echo=True, max_tokens=0, logprobs=1)
    [choice] = reply.choices
    assert choice.text == "3+4=7" and reply.usage.completion_tokens == 0
    logprobs = choice.logprobs
    assert logprobs.tokens == list("3+4=7") and logprobs.text_offset == [0, 1, 2, 3, 4]
    assert logprobs.token_logprobs[0] is None and logprobs.top_logprobs[0] is None  # nothing precedes it
    assert logprobs.token_logprobs[1:] == pytest.approx(model_logprobs(addition_base_model, "3+4=7"), abs=1e-4)
    for token, logprob, top in zip(logprobs.tokens[1:], logprobs.token_logprobs[1:], logprobs.top_logprobs[1:],
                                   strict=True):
        assert top[token] == logprob and len(top) <= 2  # the token itself and its likeliest alternative
        assert max(top.values()) >= logprob


def test_echo_with_generation_puts_the_prompt_before_the_answer(client, addition_base_model):
    plain = client.completions.create(model="tiny-adder", prompt="5+2=", max_tokens=3, temperature=0, logprobs=0)
    echoed = client.completions.create(model="tiny-adder", prompt="5+2=", max_tokens=3, temperature=0, logprobs=0,
                                       echo=True)
    answer = plain.choices[0].text
    assert echoed.choices[0].text == "5+2=" + answer
    logprobs = echoed.choices[0].logprobs
    generated = plain.choices[0].logprobs
    assert logprobs.token_logprobs[0] is None
    assert logprobs.token_logprobs[1:4] == pytest.approx(model_logprobs(addition_base_model, "5+2="), abs=1e-4)
    assert logprobs.tokens[4:] == generated.tokens
    assert logprobs.token_logprobs[4:] == pytest.approx(generated.token_logprobs, abs=1e-5)
    text = echoed.choices[0].text
    assert all(text[offset:].startswith(token) for token, offset in zip(logprobs.tokens, logprobs.text_offset,
                                                                        strict=True) if token in text)


def test_vllms_prompt_logprobs_give_each_prompt_tokens_rank(client, addition_base_model):
    reply = client.completions.create(model="tiny-adder", prompt="1+2=3", max_tokens=1, temperature=0,
                                      extra_body={"prompt_logprobs": 2})
    scored = reply.choices[0].model_extra["prompt_logprobs"]
    ids = TOKENS.encode("1+2=3")
    assert len(scored) == 5 and scored[0] is None
    expected = model_logprobs(addition_base_model, "1+2=3")
    for position, (token, entry) in enumerate(zip(ids[1:], scored[1:], strict=True)):
        own = entry[str(token)]
        assert own["logprob"] == pytest.approx(expected[position], abs=1e-4)
        assert own["decoded_token"] == TOKENS.decode([token])
        best = sorted(entry.values(), key=lambda v: v["rank"])[:2]  # the two likeliest, the token itself or not
        assert [v["rank"] for v in best] == [1, 2] and best[0]["logprob"] >= best[1]["logprob"]
        assert own["rank"] == 1 + sum(1 for v in best if v["logprob"] > own["logprob"]) or \
            (own["rank"] > 2 and own["logprob"] <= best[1]["logprob"])


def test_a_list_of_prompts_and_n_answer_one_choice_per_prompt_and_sample(client):
    """Issue 30's third request: a list of prompts, as lm-evaluation-harness batches them; with n, the API's
    numbering (prompt × n + sample)."""
    reply = client.completions.create(model="tiny-adder", prompt=["1+1=", "2+2="], max_tokens=3, temperature=0,
                                      n=2)
    assert [c.index for c in reply.choices] == [0, 1, 2, 3]
    alone = [client.completions.create(model="tiny-adder", prompt=p, max_tokens=3, temperature=0).choices[0].text
             for p in ("1+1=", "2+2=")]
    assert [c.text for c in reply.choices] == [alone[0], alone[0], alone[1], alone[1]]
    assert reply.usage.prompt_tokens == 8  # each prompt counted once
    assert reply.usage.completion_tokens == sum(len(TOKENS.encode(c.text)) + (c.finish_reason == "stop")
                                                for c in reply.choices)


def test_lm_evaluation_harness_loglikelihood_request(client, addition_base_model):
    """What lm-evaluation-harness's local-completions sends for loglikelihoods: token-id lists, temperature 0,
    max_tokens 1, logprobs 1, echo; it sums token_logprobs[ctxlen:-1] and checks each against its top dict."""
    context, continuations = "4+3=", ["7", "9"]
    batch = [TOKENS.encode(context + c) for c in continuations]
    reply = client.completions.create(model="tiny-adder", prompt=batch, temperature=0, max_tokens=1, logprobs=1,
                                      echo=True, seed=1234)
    direct = model_logprobs(addition_base_model, context + "7"), model_logprobs(addition_base_model, context + "9")
    scores = []
    for choice, ids, expected in zip(sorted(reply.choices, key=lambda c: c.index), batch, direct, strict=True):
        assert len(choice.logprobs.token_logprobs) == len(ids) + 1  # the prompt, then the one token generated
        logprob = sum(choice.logprobs.token_logprobs[len(ids) - 1:-1])
        assert logprob == pytest.approx(expected[-1], abs=1e-4)
        is_greedy = all(token == max(top.values()) for token, top in zip(
            choice.logprobs.token_logprobs[len(ids) - 1:-1], choice.logprobs.top_logprobs[len(ids) - 1:-1],
            strict=True))
        scores.append((logprob, is_greedy))
    assert sum(greedy for _, greedy in scores) <= 1  # at most one of two different answers is the argmax
    as_text = client.completions.create(model="tiny-adder", prompt=[context + c for c in continuations],
                                        max_tokens=0, echo=True, logprobs=1)
    assert [c.logprobs.token_logprobs for c in as_text.choices] == \
        [c.logprobs.token_logprobs[:-1] for c in sorted(reply.choices, key=lambda c: c.index)]


def test_completions_logprobs_k_gives_k_alternatives_and_offsets(client):
    reply = client.completions.create(model="tiny-adder", prompt="6+1=", max_tokens=4, temperature=0, logprobs=3)
    logprobs = reply.choices[0].logprobs
    assert logprobs.tokens and len(logprobs.tokens) == len(logprobs.token_logprobs) == len(logprobs.top_logprobs)
    for token, logprob, top in zip(logprobs.tokens, logprobs.token_logprobs, logprobs.top_logprobs, strict=True):
        assert top[token] == logprob and 3 <= len(top) <= 4
        assert max(top.values()) == pytest.approx(logprob)  # greedy: the sampled token is the likeliest
    assert logprobs.text_offset == [sum(len(t) for t in logprobs.tokens[:i]) for i in range(len(logprobs.tokens))]


def test_bad_prompts_are_refused_in_the_apis_error_shape(served):
    import httpx

    for prompt, message in ((["1+1=", 3], "prompt must be text"), ([[1, 2], []], "prompt 1 is empty"),
                            ([10_000], "outside the vocabulary"), ("", "prompt 0 is empty")):
        reply = httpx.post(f"{served}/completions", json={"model": "tiny-adder", "prompt": prompt})
        assert reply.status_code == 400
        error = reply.json()["error"]
        assert message in error["message"] and error["type"] == "invalid_request_error"

"""`serve` answers as the OpenAI API does where the field's tools rely on it, checked through the official `openai`
client against the real app on the tiny model: logprobs with their alternatives, the prompt's own logprobs
(lm-evaluation-harness's loglikelihood scoring), prompt lists and n, stop strings, seeds, penalties, tools,
response formats, and errors in the API's shape."""

import json
import math

import httpx
import openai
import pytest
import torch
from torch.nn import functional as F

from workers.rl.engines.torch_engine import TorchEngine
from workers.rl.models.chat_formats import END_OF_TURN, CharChat, CharTokenizer
from workers.rl.models.tiny_lm import ModelConfig, TinyLM
from workers.rl.serving.app import build_app
from workers.rl.serving.chat_completions import chat_messages

from .conftest import serving

TOKENS = CharTokenizer()
END = TOKENS.id_of(END_OF_TURN)


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
    for prompt, message in ((["1+1=", 3], "prompt must be text"), ([[1, 2], []], "prompt 1 is empty"),
                            ([10_000], "outside the vocabulary"), ("", "prompt 0 is empty"),
                            (["1+"] * 17, "more than 1024 choices")):
        reply = httpx.post(f"{served}/completions", json={"model": "tiny-adder", "prompt": prompt, "n": 64})
        assert reply.status_code == 400
        error = reply.json()["error"]
        assert message in error["message"] and error["type"] == "invalid_request_error"


def test_nan_and_infinity_are_refused_as_numbers(served):
    # Python's JSON reads NaN and Infinity; int() of either raised, a 500 instead of the caller's 400
    for route, name in (("completions", "n"), ("completions", "max_tokens"), ("chat/completions", "seed")):
        for value in ("NaN", "Infinity"):
            body = ('{"model": "tiny-adder", "prompt": "1+", "messages": [{"role": "user", "content": "1+1"}], '
                    f'"{name}": {value}}}')
            reply = httpx.post(f"{served}/{route}", content=body, headers={"content-type": "application/json"})
            assert reply.status_code == 400 and reply.json()["error"]["param"] == name


def test_a_stop_string_across_tokens_ends_the_answer_before_it(client):
    """"12" is two tokens of the character model: the engine stops on the second, the text ends before the first."""
    plain = client.completions.create(model="tiny-adder", prompt="+", max_tokens=8, temperature=0)
    assert plain.choices[0].text.startswith("312")  # the model's greedy answer here, which the stop then cuts
    stopped = client.completions.create(model="tiny-adder", prompt="+", max_tokens=8, temperature=0,
                                        stop=["xyz", "12"], logprobs=0)
    [choice] = stopped.choices
    assert choice.text == "3" and choice.finish_reason == "stop"
    assert choice.logprobs.tokens == ["3"]
    assert stopped.usage.completion_tokens == 3  # sampling stopped at the stop string, not at max_tokens
    chat = {"model": "tiny-adder", "messages": [{"role": "user", "content": "9+9="}], "temperature": 0,
            "max_tokens": 6}
    whole = client.chat.completions.create(**chat).choices[0].message.content
    assert len(whole) == 2  # "17": two tokens, the whole answer the stop string then takes away
    reply = client.chat.completions.create(**chat, stop=whole)
    assert reply.choices[0].message.content == "" and reply.choices[0].finish_reason == "stop"
    chunks = list(client.chat.completions.create(**chat, stop=whole, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == ""  # its first token held back
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_a_seed_makes_sampling_reproducible(client):
    ask = {"model": "tiny-adder", "prompt": "1+", "max_tokens": 8, "temperature": 1.0, "n": 4}
    first = [c.text for c in client.completions.create(**ask, seed=11).choices]
    again = [c.text for c in client.completions.create(**ask, seed=11).choices]
    other = [c.text for c in client.completions.create(**ask, seed=12).choices]
    assert first == again
    assert len(set(first)) > 1 and other != first  # sampled, and by the seed


def greedy_with_penalties(model, prompt: str, steps: int, presence: float, frequency: float) -> str:
    """The OpenAI API's penalties by their definition: logits - frequency × count - presence × (count > 0) of the
    tokens sampled so far, then the likeliest."""
    ids, out = TOKENS.encode(prompt), []
    for _ in range(steps):
        with torch.no_grad():
            logits = model(torch.tensor([ids + out]))[0][0, -1]
        counts = torch.bincount(torch.tensor(out, dtype=torch.long), minlength=logits.shape[0]).float()
        out.append(int((logits - frequency * counts - presence * (counts > 0).float()).argmax()))
        if out[-1] == END:
            break
    return TOKENS.decode([t for t in out if t != END])


def test_presence_and_frequency_penalties_are_applied(client, addition_base_model):
    ask = {"model": "tiny-adder", "prompt": "1+", "max_tokens": 8, "temperature": 0}
    plain = client.completions.create(**ask).choices[0].text
    penalised = client.completions.create(**ask, presence_penalty=1.0, frequency_penalty=2.0).choices[0].text
    assert plain == greedy_with_penalties(addition_base_model, "1+", 8, 0, 0)
    assert penalised == greedy_with_penalties(addition_base_model, "1+", 8, 1.0, 2.0) != plain
    with pytest.raises(openai.BadRequestError, match="presence_penalty must be from -2 to 2"):
        client.completions.create(**ask, presence_penalty=3)


def scripted_model(writes: dict[int, str], context: int) -> TinyLM:
    """A TinyLM whose weights are set by hand so that its greedy answer is a script: after `position` tokens it
    writes `writes[position]` (then the end of the turn), whatever the tokens were — a model that calls a tool
    exactly as the Hermes convention says, with no training. Each position's embedding is its own axis; attention
    and the MLP add nothing; the head maps each position to the token the script puts after it."""
    model = TinyLM(ModelConfig(vocab_size=TOKENS.vocab_size, block_size=context, n_layer=1, n_head=1,
                               n_embd=context))
    following = {}
    for start, text in writes.items():
        for offset, token in enumerate(TOKENS.encode(text) + [END]):
            following[start - 1 + offset] = token
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.zero_()
        model.position.weight.copy_(torch.eye(context))
        for norm in (model.ln, model.blocks[0].ln1, model.blocks[0].ln2):
            norm.weight.fill_(1.0)
        for position in range(context):
            model.head.weight[following.get(position, END), position] = 10.0
    return model


def test_tool_calls_come_back_as_the_apis_and_tool_results_continue_the_conversation():
    tools = [{"type": "function", "function": {"name": "add", "description": "a + b", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}}}]
    question = [{"role": "user", "content": "add 2 and 3"}]
    call = {"name": "add", "arguments": {"a": 2, "b": 3}}
    asked = len(CharChat().prompt(question, []))
    # The second request's prompt, as the server renders the conversation the client sends back.
    follow_up = question + [{"role": "assistant", "content": "Sure.", "tool_calls": [
        {"id": "x", "type": "function", "function": {"name": "add", "arguments": json.dumps(call["arguments"])}}]},
        {"role": "tool", "tool_call_id": "x", "content": "5"}]
    answered = len(CharChat().prompt(chat_messages(follow_up), []))
    model = scripted_model({asked: "Sure.<tool_call>" + json.dumps(call) + "</tool_call>", answered: "It is 5."},
                           context=128)
    engine = TorchEngine(model)
    with serving(build_app(engine=engine, chat=CharChat(), model_name="scripted")) as url:
        client = openai.OpenAI(base_url=url, api_key="unused", max_retries=0)
        reply = client.chat.completions.create(model="scripted", messages=question, tools=tools, temperature=0)
        [choice] = reply.choices
        assert choice.finish_reason == "tool_calls" and choice.message.content == "Sure."
        [made] = choice.message.tool_calls
        assert made.type == "function" and made.function.name == "add"
        assert json.loads(made.function.arguments) == {"a": 2, "b": 3} and made.id
        following = client.chat.completions.create(model="scripted", temperature=0, tools=tools, messages=[
            *question, choice.message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": made.id, "content": "5"}])
        assert following.choices[0].message.content == "It is 5."
        assert following.choices[0].finish_reason == "stop" and not following.choices[0].message.tool_calls
        chunks = list(client.chat.completions.create(model="scripted", messages=question, tools=tools,
                                                     temperature=0, stream=True))
        deltas = [c.choices[0].delta for c in chunks if c.choices]
        streamed = [call for delta in deltas for call in delta.tool_calls or []]
        assert [(c.index, c.function.name, json.loads(c.function.arguments)) for c in streamed] == \
            [(0, "add", {"a": 2, "b": 3})]
        assert "".join(d.content or "" for d in deltas) == "Sure."
        assert chunks[-1].choices[0].finish_reason == "tool_calls"
        untouched = client.chat.completions.create(model="scripted", messages=question, tools=tools,
                                                   tool_choice="none", temperature=0)
        assert untouched.choices[0].message.content.startswith("Sure.<tool_call>{")
        assert untouched.choices[0].finish_reason == "stop" and not untouched.choices[0].message.tool_calls
        with pytest.raises(openai.BadRequestError, match="tool_choice .*required.* is not supported") as refused:
            client.chat.completions.create(model="scripted", messages=question, tools=tools, tool_choice="required")
        assert refused.value.body["type"] == "invalid_request_error"
    engine.close()


def test_response_formats_are_refused_with_a_400_that_says_so(client):
    chat = {"model": "tiny-adder", "messages": [{"role": "user", "content": "3+4="}], "max_tokens": 2}
    for response_format in ({"type": "json_object"},
                            {"type": "json_schema", "json_schema": {"name": "sum", "schema": {"type": "object"}}}):
        with pytest.raises(openai.BadRequestError, match="does not constrain decoding to JSON") as refused:
            client.chat.completions.create(**chat, response_format=response_format)
        assert refused.value.body["param"] == "response_format"
    assert client.chat.completions.create(**chat, response_format={"type": "text"}).choices[0].message.content


def test_parameters_are_ignored_only_where_vllm_ignores_them(served, client):
    chat = {"model": "tiny-adder", "messages": [{"role": "user", "content": "3+4="}], "max_tokens": 2,
            "temperature": 0}
    expected = client.chat.completions.create(**chat).choices[0].message.content
    # Unknown to vLLM and to this server: accepted and ignored, as vLLM does; no-op values of unhonoured ones too.
    assert client.chat.completions.create(**chat, top_p=1.0, user="someone", metadata={"k": "v"},
                                          extra_body={"a_clients_own_extra": 1, "top_k": -1}
                                          ).choices[0].message.content == expected
    # Honoured by vLLM, not here: refused by name rather than silently changing nothing.
    for extra in ({"top_p": 0.5}, {"extra_body": {"top_k": 5}}, {"extra_body": {"min_tokens": 3}},
                  {"logit_bias": {"5": 10}}):
        with pytest.raises(openai.BadRequestError, match="is not supported by this server") as refused:
            client.chat.completions.create(**chat, **extra)
        assert refused.value.body["param"] in ("top_p", "top_k", "min_tokens", "logit_bias")
    reply = httpx.post(f"{served}/completions", json={"model": "tiny-adder", "prompt": "1+", "stream": True})
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "stream"


def test_the_transformers_engine_scores_prompts_and_gives_alternatives_too(tmp_path):
    """The same fields from the transformers engine (its own scoring pass), on a tiny random Llama: the prompt's
    logprobs are its forward pass's, a batch of prompts answers in order."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from workers.rl.engines.hf import TransformersEngine
    from workers.rl.models.chat_formats import HFChat
    from workers.rl.models.hf_tiny import make_tiny_hf_model

    directory = make_tiny_hf_model(tmp_path, hidden_size=32, layers=1, heads=2, max_positions=64)
    tokenizer = AutoTokenizer.from_pretrained(directory)
    model = AutoModelForCausalLM.from_pretrained(directory).eval()
    engine = TransformersEngine(str(directory))
    with serving(build_app(engine=engine, chat=HFChat(tokenizer), model_name="llama")) as url:
        client = openai.OpenAI(base_url=url, api_key="unused", max_retries=0)
        reply = client.completions.create(model="llama", prompt=["12+7=19", "3+3=6"], echo=True, max_tokens=0,
                                          logprobs=2)
        chat = client.chat.completions.create(model="llama", messages=[{"role": "user", "content": "1+1="}],
                                              max_tokens=3, temperature=0, logprobs=True, top_logprobs=3)
    engine.close()
    for choice, text in zip(reply.choices, ["12+7=19", "3+3=6"], strict=True):
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0, :-1]
        expected = F.log_softmax(logits, dim=-1).gather(1, torch.tensor(ids[1:])[:, None]).squeeze(1).tolist()
        assert choice.text == text and choice.logprobs.token_logprobs[0] is None
        assert choice.logprobs.token_logprobs[1:] == pytest.approx(expected, abs=1e-4)
        assert all(len(top) <= 3 for top in choice.logprobs.top_logprobs[1:])
    for entry in chat.choices[0].logprobs.content:
        assert [t.logprob for t in entry.top_logprobs] == sorted((t.logprob for t in entry.top_logprobs), reverse=True)
        assert len(entry.top_logprobs) == 3 and entry.top_logprobs[0].token == entry.token

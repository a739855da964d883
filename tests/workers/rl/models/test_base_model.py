"""The base model the project makes itself: its chat format, its deliberately noisy corpus, its pretraining."""

import random
import re

from workers.definitions.specs import ToolSpec
from workers.rl.models.base_model import corrupt, pretrain, pretraining_example, reference_turns
from workers.rl.models.chat_formats import ASSISTANT, END_OF_TURN, CharChat, CharTokenizer
from workers.rl.rollout.tools import RUN_PYTHON_TOOL


def test_the_tokenizer_round_trips_and_maps_unknown_characters_to_a_question_mark():
    tokenizer = CharTokenizer()
    text = "12+7=" + ASSISTANT + "19" + END_OF_TURN + "\n"
    assert tokenizer.decode(tokenizer.encode(text)) == text
    assert tokenizer.decode(tokenizer.encode("a→b")) == "a?b"
    assert tokenizer.decode(tokenizer.encode("\tx")) == "    x"
    fenced = tokenizer.encode("```python\nx = 1\n```")
    assert len(fenced) == 7 and tokenizer.decode(fenced[:1]) == "```python\n"  # the markers are single tokens
    assert len(tokenizer.encode("<tool_call>{}</tool_call>")) == 4


def test_the_chat_format_grows_by_ids_and_decodes_without_the_stop_token():
    chat = CharChat()
    prompt = chat.prompt([{"role": "system", "content": "ignored"}, {"role": "user", "content": "2+2="}], [])
    assert chat.tokenizer.decode(prompt) == "2+2=" + ASSISTANT
    after_tool = chat.continuation([], [{"role": "tool", "content": "4"}], [])
    assert chat.tokenizer.decode(after_tool) == "<tool_response>4</tool_response>" + ASSISTANT
    assert chat.decode(chat.tokenizer.encode("4" + END_OF_TURN)) == "4"


def test_reference_turns_cover_every_demo_family():
    rng = random.Random(0)
    assert reference_turns(tools=[], inputs={"a": 1, "b": 2}, hidden={"answer": 3}, rng=rng) == [
        {"role": "assistant", "content": "3"}]
    word = reference_turns(tools=[], inputs={}, hidden={"answer": 5, "working": "2 + 3 = 5"}, rng=rng)
    assert word[-1]["content"].endswith("Answer: 5")
    code = reference_turns(tools=[ToolSpec.model_validate(RUN_PYTHON_TOOL)], inputs={"example": "f(2) == 4"},
                           hidden={"canonical_solution": "def f(x):\n    return x * 2"}, rng=rng,
                           tool_call_fraction=1.0)
    assert [t["role"] for t in code] == ["assistant", "tool", "assistant"]
    assert "print(f(2))" in code[0]["content"] and code[1]["content"].endswith("4\n")
    assert code[-1]["content"].startswith("```python\ndef f(x):")
    assert reference_turns(tools=[], inputs={}, hidden={"nothing": 1}, rng=rng) is None


def test_corruption_moves_exactly_one_number_and_leaves_the_rest():
    rng = random.Random(3)
    for _ in range(50):
        noisy = corrupt("12 + 30 = 42", rng)
        numbers = [int(n) for n in re.findall(r"\d+", noisy)]
        assert sum(a != b for a, b in zip(numbers, [12, 30, 42], strict=True)) == 1
        assert re.sub(r"\d+", "N", noisy) == "N + N = N"
    assert corrupt("no digits here", rng) == "no digits here"


def test_the_corpus_is_noisy_on_purpose():
    rng = random.Random(0)
    turns = [{"role": "assistant", "content": "19"}]
    rendered = [pretraining_example(prompt="12+7=", turns=turns, rng=rng, wrong_fraction=0.5) for _ in range(2000)]
    wrong = sum(text != "12+7=" + ASSISTANT + "19" + END_OF_TURN for text in rendered)
    assert 0.45 < wrong / len(rendered) < 0.55


def test_a_short_pretraining_learns_the_format():
    corpus = [(f"{a}+{b}=", [{"role": "assistant", "content": str(a + b)}]) for a in range(10) for b in range(10)]
    model, report = pretrain(corpus, steps=150, seed=0, block_size=64)
    assert report["short"] == 100 and report["long"] == 0
    assert report["last_loss"] < report["first_loss"] * 0.5
    chat = CharChat()
    tokens, _ = model.generate(chat.prompt([{"role": "user", "content": "3+4="}], []), samples=20,
                               max_new_tokens=4, stop=chat.stop_ids)
    answers = [chat.decode(row.tolist()) for row in tokens]
    assert sum(answer.isdigit() for answer in answers) >= 16, answers

"""The SFT and DPO data contract (workers/rl/training/data_files.py) and what the trainer makes of a row: a file
that breaks the contract is refused naming its line, a changed file is refused against its pinned hash, the rows
of a step follow from the seed alone, and only the assistant's tokens are trained on — prompts and tool results
are context — with the chat template of a Hugging Face model and with the demo's character model alike."""

import json

import pytest

from workers.rl.models.chat_formats import CharChat, HFChat
from workers.rl.models.hf_tiny import char_tokenizer
from workers.rl.training.data_files import DataFileError, file_sha256, read_dataset, step_rows

CALL = {"type": "function", "function": {"name": "run_python", "arguments": "{\"code\": \"print(2+3)\"}"}}
CONVERSATION = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+3?"},
                {"role": "assistant", "content": "", "tool_calls": [CALL]}, {"role": "tool", "content": "5"},
                {"role": "assistant", "content": "5"}]


def _write(path, *rows):
    path.write_text("".join((row if isinstance(row, str) else json.dumps(row)) + "\n" for row in rows))
    return path


@pytest.mark.parametrize(("kind", "line", "expected"), [
    ("sft", "not json", "line 2: not a JSON object"),
    ("sft", {"messages": [{"role": "robot", "content": "x"}]}, r"line 2: messages\[0\]: role 'robot' is not"),
    ("sft", {"messages": [{"role": "user", "content": "hi"}]}, "line 2: no assistant message"),
    ("sft", {"prompt": [], "chosen": [], "rejected": []}, "line 2: an SFT row is .* train it with --kind dpo"),
    ("dpo", {"messages": CONVERSATION}, "line 2: a preference row is .* missing .* --kind sft"),
    ("dpo", {"prompt": [{"role": "user", "content": "q"}], "chosen": [{"role": "user", "content": "a"}],
             "rejected": [{"role": "assistant", "content": "b"}]}, "line 2: chosen starts with the assistant"),
    ("sft", {"messages": [{"role": "user", "content": "q", "tool_calls": [CALL]},
                          {"role": "assistant", "content": "a"}]}, "only an assistant message makes tool calls"),
])
def test_a_row_that_breaks_the_contract_is_refused_naming_its_line(tmp_path, kind, line, expected):
    good = {"messages": CONVERSATION} if kind == "sft" else {
        "prompt": [{"role": "user", "content": "q"}], "chosen": [{"role": "assistant", "content": "a"}],
        "rejected": [{"role": "assistant", "content": "b"}]}
    path = _write(tmp_path / "data.jsonl", good, line)
    with pytest.raises(DataFileError, match=expected):
        read_dataset(path, kind)


def test_provenance_is_ignored_tool_calls_become_the_studios_format_and_a_changed_file_is_refused(tmp_path):
    path = _write(tmp_path / "data.jsonl", {"messages": CONVERSATION, "provenance": {"run": "r1", "seq": 3}}, "")
    pinned = file_sha256(path)
    [row] = read_dataset(path, "sft", sha256=pinned)
    assert row.line == 1 and not hasattr(row, "provenance")
    assert row.messages[2]["content"] == '<tool_call>\n{"name": "run_python", "arguments": {"code": ' \
                                         '"print(2+3)"}}\n</tool_call>'
    path.write_text(path.read_text().replace("2+3?", "2+4?"))
    with pytest.raises(DataFileError, match="changed since the run pinned it"):
        read_dataset(path, "sft", sha256=pinned)


def test_a_steps_rows_follow_from_the_seed_and_every_pass_covers_the_data():
    steps = [step_rows(10, batch=4, step=step, seed=7) for step in range(1, 6)]  # 20 rows: two passes
    assert steps == [step_rows(10, batch=4, step=step, seed=7) for step in range(1, 6)]
    flat = [index for rows in steps for index in rows]
    assert sorted(flat[:10]) == list(range(10)) and sorted(flat[10:]) == list(range(10))
    assert flat[:10] != flat[10:]  # reshuffled every pass
    assert steps[0] != step_rows(10, batch=4, step=1, seed=8)


def _trained_text(decode, ids, mask):
    return "".join(decode([token]) for token, trained in zip(ids, mask, strict=True) if trained)


def test_only_the_assistants_tokens_are_trained_on_with_a_chat_template():
    tokenizer = char_tokenizer()
    chat = HFChat(tokenizer)
    messages = [dict(m) for m in CONVERSATION[:2]] + [
        {"role": "assistant", "content": "<tool_call>x</tool_call>"}, {"role": "tool", "content": "5"},
        {"role": "assistant", "content": "The sum is 5"}, {"role": "user", "content": "thanks"}]
    ids, mask = chat.training_tokens(messages, [])
    assert ids == tokenizer(tokenizer.apply_chat_template(messages[:5], tokenize=False),
                            add_special_tokens=False)["input_ids"]  # the whole text, tokenized once
    # Each assistant message with its end of turn, as TRL's {% generation %} marks it; the final user message
    # teaches nothing and is left out.
    assert _trained_text(tokenizer.decode, ids, mask) == "<tool_call>x</tool_call><|im_end|>\nThe sum is 5<|im_end|>\n"
    # A DPO answer: only what follows the prompt.
    ids, mask = chat.training_tokens(messages[:5], [], trained_from=4)
    assert _trained_text(tokenizer.decode, ids, mask) == "The sum is 5<|im_end|>\n"


def test_only_the_assistants_tokens_are_trained_on_with_the_character_model():
    chat = CharChat()
    ids, mask = chat.training_tokens([{"role": "user", "content": "2+3="}, {"role": "assistant", "content": "call"},
                                      {"role": "tool", "content": "5"}, {"role": "assistant", "content": "5"}], [])
    assert chat.tokenizer.decode(ids) == "2+3=\x02call\x03<tool_response>5</tool_response>\x025\x03"
    assert _trained_text(chat.tokenizer.decode, ids, mask) == "call\x035\x03"

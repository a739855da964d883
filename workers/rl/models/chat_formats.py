"""From messages to the token ids a policy sees, and back.

A conversation grows by token ids, never by re-tokenising text: the ids the policy sampled are exactly the
ids it is trained on, and each tool result appends only its own ids. Two formats:
- `CharChat` for the project's character-level model: a user message, then \\x02 (the assistant begins);
  the assistant ends its turn with \\x03; tool results are `<tool_response>...</tool_response>` followed by
  \\x02 again. The system prompt is left out: a model of a few hundred thousand parameters cannot use
  instructions, and every character of context costs it.
- `HFChat` for Hugging Face models: the tokenizer's own chat template (with the tools), and the ids a new
  message adds are the template's rendering of the longer conversation minus that of the shorter one. A
  template that takes no tools (SmolLM2's, the tiny test Llama's) gets the Hermes tool instructions in its
  system message instead — the format `tools.parse_tool_calls` reads, as Qwen2.5's and Hermes' templates
  write it — so every model is taught the call format the studio parses.
"""

from __future__ import annotations

import hashlib
import json
import re

ASSISTANT = "\x02"
END_OF_TURN = "\x03"
# Printable ASCII, newline, and the two turn markers: everything the demo domains write.
CHAR_VOCABULARY = "\n" + "".join(chr(c) for c in range(32, 127)) + ASSISTANT + END_OF_TURN
# Format markers as single tokens, as chat models' tokenizers have them: a model of a few hundred thousand
# parameters learns "open a code block here" in seconds, but counting three backticks one character at a time
# takes it far longer than its pretraining minute.
FORMAT_MARKERS = ("```python\n", "\n```", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")


class CharTokenizer:
    """One id per character, and one per format marker (matched first). Characters outside the vocabulary (in a
    prompt) become '?'."""

    def __init__(self, vocabulary: str = CHAR_VOCABULARY, markers: tuple[str, ...] = FORMAT_MARKERS):
        self.tokens = list(vocabulary) + list(markers)
        self._ids = {token: i for i, token in enumerate(self.tokens)}
        self._unknown = self._ids.get("?", 0)
        longest_first = sorted(markers, key=len, reverse=True)
        self._pattern = re.compile("|".join([*(re.escape(m) for m in longest_first), "."]), re.DOTALL)

    @property
    def vocab_size(self) -> int:
        return len(self.tokens)

    @property
    def signature(self) -> str:
        """Names the vocabulary: a model trained with another cannot be reused with this one."""
        return hashlib.sha256("\x00".join(self.tokens).encode()).hexdigest()[:12]

    def id_of(self, token: str) -> int:
        return self._ids[token]

    def encode(self, text: str) -> list[int]:
        return [self._ids.get(match, self._unknown) for match in self._pattern.findall(text.replace("\t", "    "))]

    def decode(self, ids) -> str:
        return "".join(self.tokens[int(i)] for i in ids)


class CharChat:
    def __init__(self, tokenizer: CharTokenizer | None = None):
        self.tokenizer = tokenizer or CharTokenizer()
        self.end = self.tokenizer.id_of(END_OF_TURN)
        self.stop_ids = (self.end,)

    def render(self, messages: list[dict]) -> str:
        """The text of a whole conversation as the model is trained on it (pretraining uses this too)."""
        parts = []
        for message in messages:
            role, content = message["role"], message.get("content", "")
            if role == "user":
                parts.append(content + ASSISTANT)
            elif role == "assistant":
                parts.append(content + END_OF_TURN)
            elif role == "tool":
                parts.append(f"<tool_response>{content}</tool_response>" + ASSISTANT)
        return "".join(parts)

    def prompt(self, messages: list[dict], tools: list[dict]) -> list[int]:
        return self.tokenizer.encode(self.render([m for m in messages if m["role"] != "system"]))

    def continuation(self, messages: list[dict], new: list[dict], tools: list[dict]) -> list[int]:
        return self.tokenizer.encode(self.render(new))

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(i for i in ids if i != self.end)

    def training_tokens(self, messages: list[dict], tools: list[dict], trained_from: int = 0):
        """(ids, mask) of a whole conversation as the model reads it, the mask 1 on the tokens of the assistant's
        messages from index `trained_from` on (their text and the end of turn; prompts and tool results are
        context). Message by message: a turn's markers end every message, so no token spans two."""
        ids, mask = [], []
        for index, message in enumerate(_through_last_trained(messages, trained_from)):
            if message["role"] == "system":
                continue
            piece = self.tokenizer.encode(self.render([message]))
            ids += piece
            mask += [int(message["role"] == "assistant" and index >= trained_from)] * len(piece)
        return ids, mask


def canonical_tools(tools) -> list[dict]:
    """Function schemas written one way whatever order their keys came in: name, description, parameters, and the
    parameters' keys sorted. A rollout reads its template's tools from the registry (PostgreSQL's jsonb reorders
    keys), an SFT row from a dataset file (written with sorted keys): rendered as they came, the prompt SFT trained
    on was not the one the policy answered, and SmolLM2, trained on one order, copied a tool's schema out of the
    other instead of calling the tool."""
    return [{"name": tool.get("name", ""), "description": tool.get("description", ""),
             "parameters": _sorted_keys(tool.get("parameters", {}))} for tool in tools or ()]


def _sorted_keys(value):
    if isinstance(value, dict):
        return {key: _sorted_keys(value[key]) for key in sorted(value)}
    if isinstance(value, list):
        return [_sorted_keys(item) for item in value]
    return value


def tool_instructions(tools: list[dict]) -> str:
    """The tool instructions Qwen2.5's chat template writes into the system message (Hermes function calling)."""
    signatures = "\n".join(json.dumps({"type": "function", "function": tool}) for tool in tools)
    return ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
            f"You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{signatures}\n"
            "</tools>\n\nFor each function call, return a json object with function name and arguments within "
            '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": '
            "<args-json-object>}\n</tool_call>")


class HFChat:
    """Any Hugging Face tokenizer with a chat template."""

    def __init__(self, tokenizer):
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("this tokenizer has no chat template; set tokenizer.chat_template or use a chat model")
        self.tokenizer = tokenizer
        stops = {tokenizer.eos_token_id}
        for marker in ("<|im_end|>", "<|eot_id|>", "<|end|>"):
            token_id = tokenizer.convert_tokens_to_ids(marker) if marker in tokenizer.get_vocab() else None
            if token_id is not None:
                stops.add(token_id)
        self.stop_ids = tuple(sorted(i for i in stops if i is not None))
        probe = {"name": "probe_tool_7f3a", "description": "d", "parameters": {"type": "object", "properties": {}}}
        self.template_takes_tools = "probe_tool_7f3a" in self.tokenizer.apply_chat_template(
            [{"role": "user", "content": "hi"}], tools=[probe], tokenize=False)

    def _render(self, messages, tools, *, generation_prompt: bool) -> str:
        tools = canonical_tools(tools)
        if tools and not self.template_takes_tools:
            messages = with_tool_instructions(messages, tools)
            tools = None
        return self.tokenizer.apply_chat_template(messages, tools=tools or None, tokenize=False,
                                                  add_generation_prompt=generation_prompt)

    def prompt(self, messages: list[dict], tools: list[dict]) -> list[int]:
        text = self._render(messages, tools, generation_prompt=True)
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def continuation(self, messages: list[dict], new: list[dict], tools: list[dict]) -> list[int]:
        before = self._render(messages, tools, generation_prompt=False)
        after = self._render(messages + new, tools, generation_prompt=True)
        if not after.startswith(before):
            # Some templates rewrite earlier turns (e.g. drop reasoning); append the new messages on their own.
            after, before = self._render(new, tools, generation_prompt=True), ""
        return self.tokenizer(after[len(before):], add_special_tokens=False)["input_ids"]

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode([i for i in ids if i not in self.stop_ids], skip_special_tokens=False)

    def training_tokens(self, messages: list[dict], tools: list[dict], trained_from: int = 0):
        """(ids, mask) of a whole conversation rendered by the chat template, the mask 1 on the tokens of the
        assistant's messages from index `trained_from` on: what the template adds for the message after the
        generation prompt (its text and end of turn, as TRL's training templates mark `{% generation %}`).

        The conversation is tokenized once as a whole (what the model reads at inference), and each token is
        marked by where its characters start (the fast tokenizer's offsets), as transformers'
        return_assistant_tokens_mask does for templates that carry generation markers; SmolLM2's and most others
        do not, so the spans are found by rendering the conversation up to each assistant message."""
        messages = _through_last_trained(messages, trained_from)
        text = self._render(messages, tools, generation_prompt=False)
        spans = []
        for index, message in enumerate(messages):
            if message["role"] != "assistant" or index < trained_from:
                continue
            before = self._render(messages[:index], tools, generation_prompt=True) if index else ""
            after = self._render(messages[:index + 1], tools, generation_prompt=False)
            if not (after.startswith(before) and text.startswith(after)):
                raise ValueError("the chat template rewrites earlier turns of this conversation (as some drop "
                                 "reasoning), so its assistant tokens cannot be told apart: set a chat_template that "
                                 "renders each turn once")
            spans.append((len(before), len(after)))
        encoded = self.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        mask = [int(any(start <= offset < end for start, end in spans)) for offset, _ in encoded["offset_mapping"]]
        return list(encoded["input_ids"]), mask


def _through_last_trained(messages: list[dict], trained_from: int) -> list[dict]:
    """The conversation up to its last assistant message at or after `trained_from`: what follows teaches
    nothing."""
    last = max((i for i, m in enumerate(messages) if m["role"] == "assistant" and i >= trained_from), default=None)
    if last is None:
        raise ValueError("the conversation has no assistant message to train on")
    return list(messages[:last + 1])


def with_tool_instructions(messages: list[dict], tools: list[dict]) -> list[dict]:
    """`messages` with the tool instructions at the end of the system message (one is added if none leads)."""
    instructions = tool_instructions(tools)
    if messages and messages[0]["role"] == "system":
        return [{**messages[0], "content": f"{messages[0]['content']}\n\n{instructions}"}, *messages[1:]]
    return [{"role": "system", "content": instructions}, *messages]

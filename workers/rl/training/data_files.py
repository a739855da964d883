"""The training data of SFT and DPO runs: JSONL files in TRL's conversational formats, read and checked here.

One row per line, as TRL's SFTTrainer and DPOTrainer (and OpenAI's fine-tuning) take them:
- SFT: `{"messages": [{"role": "system" | "user" | "assistant" | "tool", "content": "..."}, ...]}`. An assistant
  message may carry OpenAI-style `tool_calls` (written into its text as the `<tool_call>` blocks the studio's
  agent loop parses, workers/rl/rollout/tools.py); a `tool` message is a tool's result. Only the assistant's
  tokens are trained on.
- DPO: `{"prompt": [messages], "chosen": [messages], "rejected": [messages]}`: the same prompt answered twice.
Either may carry `"tools"` (the function schemas the prompt offered) and a `"provenance"` object (where the row
came from: ignored by training). A file that breaks the contract is refused with the line and what is wrong.

`file_sha256` hashes a file as a run pins it (SFTConfig.dataset_sha256); `read_dataset` refuses one that changed.
"""

from __future__ import annotations

import functools
import hashlib
import json
import random
from dataclasses import dataclass
from pathlib import Path

ROLES = ("system", "user", "assistant", "tool")
SFT, DPO = "sft", "dpo"
# A line longer than this is not a conversation a model of the studio trains on; read no further into it.
MAX_LINE_BYTES = 16 * 1024 * 1024
MAX_ROWS = 10_000_000


class DataFileError(ValueError):
    """The dataset file breaks the row contract; the message names the file, the line and the fix."""


@dataclass(frozen=True)
class ConversationRow:
    """An SFT row: a conversation, trained on its assistant messages."""

    line: int
    messages: tuple[dict, ...]
    tools: tuple[dict, ...] = ()


@dataclass(frozen=True)
class PreferenceRow:
    """A DPO row: a prompt and two answers to it, `chosen` preferred over `rejected`."""

    line: int
    prompt: tuple[dict, ...]
    chosen: tuple[dict, ...]
    rejected: tuple[dict, ...]
    tools: tuple[dict, ...] = ()


def file_sha256(path: Path | str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def read_dataset(path: Path | str, kind: str, *, sha256: str = "") -> list[ConversationRow] | list[PreferenceRow]:
    """Every row of the JSONL file at `path` for a run of `kind` (sft or dpo), checked. With `sha256` (what the run
    pinned), a file whose content changed since is refused."""
    path = Path(path)
    if kind not in (SFT, DPO):
        raise ValueError(f"datasets train sft or dpo runs, not {kind!r}")
    if not path.is_file():
        raise DataFileError(f"dataset {path}: no such file (the run reads it where it trains)")
    if sha256 and file_sha256(path) != sha256:
        raise DataFileError(f"dataset {path}: its content changed since the run pinned it (sha256 {sha256[:12]}…); "
                           "start a new run on the file as it is now, or put the pinned file back")
    rows = []
    with open(path, "rb") as handle:
        for number, raw in enumerate(handle, start=1):
            if len(raw) > MAX_LINE_BYTES:
                raise DataFileError(f"{path}, line {number}: longer than {MAX_LINE_BYTES // (1024 * 1024)} MiB")
            if not raw.strip():
                continue
            if len(rows) >= MAX_ROWS:
                raise DataFileError(f"{path}: more than {MAX_ROWS:,} rows")
            try:
                data = json.loads(raw)
            except (UnicodeDecodeError, ValueError) as exc:
                raise DataFileError(f"{path}, line {number}: not a JSON object ({exc})") from None
            rows.append(_row(data, kind, number, path))
    if not rows:
        raise DataFileError(f"dataset {path}: no rows (one JSON object per line)")
    return rows


def _row(data, kind: str, line: int, path: Path) -> ConversationRow | PreferenceRow:
    where = f"{path}, line {line}"
    if not isinstance(data, dict):
        raise DataFileError(f"{where}: a row is a JSON object, not {type(data).__name__}")
    tools = data.get("tools") or ()
    if isinstance(tools, str):  # TRL's datasets keep tools as a JSON string column
        try:
            tools = json.loads(tools)
        except ValueError:
            raise DataFileError(f"{where}: tools is a string that is not JSON") from None
    if not isinstance(tools, list | tuple) or not all(isinstance(t, dict) for t in tools):
        raise DataFileError(f"{where}: tools is a list of function schemas (objects)")
    tools = tuple(t.get("function", t) if t.get("type") == "function" else t for t in tools)
    if kind == SFT:
        if "messages" not in data:
            raise DataFileError(f"{where}: an SFT row is {{\"messages\": [...]}}; found keys {sorted(data)[:8]}"
                               + (" (a preference row: train it with --kind dpo)" if "chosen" in data else ""))
        messages = _messages(data["messages"], f"{where}: messages")
        if not any(m["role"] == "assistant" for m in messages):
            raise DataFileError(f"{where}: no assistant message, so nothing to train on")
        return ConversationRow(line, messages, tools)
    missing = [key for key in ("prompt", "chosen", "rejected") if key not in data]
    if missing:
        raise DataFileError(f"{where}: a preference row is {{\"prompt\": [...], \"chosen\": [...], \"rejected\": "
                           f"[...]}}; {', '.join(missing)} missing"
                           + (" (an SFT row: train it with --kind sft)" if "messages" in data else ""))
    prompt = _messages(data["prompt"], f"{where}: prompt")
    chosen = _messages(data["chosen"], f"{where}: chosen")
    rejected = _messages(data["rejected"], f"{where}: rejected")
    for name, answer in (("chosen", chosen), ("rejected", rejected)):
        if not answer or answer[0]["role"] != "assistant":
            raise DataFileError(f"{where}: {name} starts with the assistant's answer to the prompt")
    if prompt[-1]["role"] == "assistant":
        raise DataFileError(f"{where}: the prompt ends with an assistant message; the answers belong in chosen and "
                           "rejected")
    return PreferenceRow(line, prompt, chosen, rejected, tools)


def _messages(value, where: str) -> tuple[dict, ...]:
    if not isinstance(value, list) or not value:
        raise DataFileError(f"{where}: a non-empty list of messages")
    messages = []
    for index, message in enumerate(value):
        at = f"{where}[{index}]"
        if not isinstance(message, dict):
            raise DataFileError(f"{at}: a message is an object with role and content")
        role = message.get("role")
        if role not in ROLES:
            raise DataFileError(f"{at}: role {str(role)[:40]!r} is not one of {', '.join(ROLES)}")
        content = message.get("content")
        if content is None:
            content = ""
        if isinstance(content, list):  # OpenAI's content parts: the text ones, joined
            if not all(isinstance(part, dict) and part.get("type") == "text" for part in content):
                raise DataFileError(f"{at}: only text content parts can be trained on")
            content = "".join(str(part.get("text", "")) for part in content)
        if not isinstance(content, str):
            raise DataFileError(f"{at}: content is text")
        calls = message.get("tool_calls") or []
        if calls and role != "assistant":
            raise DataFileError(f"{at}: only an assistant message makes tool calls")
        if not isinstance(calls, list):
            raise DataFileError(f"{at}: tool_calls is a list")
        blocks = [_tool_call_text(call, f"{at}.tool_calls[{n}]") for n, call in enumerate(calls)]
        if blocks:
            content = "\n".join([content, *blocks]) if content else "\n".join(blocks)
        if role != "assistant" and not content:
            raise DataFileError(f"{at}: a {role} message with no content")
        messages.append({"role": role, "content": content})
    return tuple(messages)


def _tool_call_text(call, at: str) -> str:
    """An OpenAI-style tool call as the Hermes block the studio's agent loop parses (and HFChat teaches)."""
    function = call.get("function", call) if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise DataFileError(f"{at}: a tool call names its function: {{\"function\": {{\"name\": ..., "
                           "\"arguments\": {...}}}")
    arguments = function.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            raise DataFileError(f"{at}: arguments is a string that is not JSON") from None
    payload = json.dumps({"name": function["name"], "arguments": arguments}, ensure_ascii=False)
    return f"<tool_call>\n{payload}\n</tool_call>"


def step_rows(count: int, *, batch: int, step: int, seed: int) -> list[int]:
    """The indices of the rows step `step` (1-based) trains on: the data in a fresh seeded order every pass,
    `batch` rows a step, a pass's tail continuing into the next. The same seed gives the same order, so a run
    resumed at any step draws what it would have drawn."""
    start = (step - 1) * batch
    rows = []
    while len(rows) < batch:
        epoch, offset = divmod(start + len(rows), count)
        rows.extend(_pass_order(count, seed, epoch)[offset:offset + batch - len(rows)])
    return rows


@functools.lru_cache(maxsize=2)  # a step reads one pass, or the end of one and the start of the next
def _pass_order(count: int, seed: int, epoch: int) -> tuple[int, ...]:
    order = list(range(count))
    random.Random(f"{seed}:{epoch}").shuffle(order)
    return tuple(order)


def dataset_corpus(path: str) -> list[tuple[str, list[dict]]]:
    """The built-in demo model's pretraining corpus (models/build.py) for an SFT or DPO run on a dataset alone (no
    bundle, so no tasks): each row's conversation up to its first answer as the prompt, and that answer (the chosen
    one of a preference pair) as what the assistant writes."""
    with open(path, "rb") as handle:  # the first row says which format the file is in; read_dataset checks all
        first = json.loads(next(line for line in handle if line.strip()))
    corpus = []
    for row in read_dataset(path, DPO if isinstance(first, dict) and "chosen" in first else SFT):
        if isinstance(row, PreferenceRow):
            prompt, answer = row.prompt, row.chosen
        else:
            first_answer = next(n for n, message in enumerate(row.messages) if message["role"] == "assistant")
            prompt, answer = row.messages[:first_answer], row.messages[first_answer:]
        corpus.append(("\n".join(message["content"] for message in prompt), [dict(turn) for turn in answer]))
    return corpus

"""A dataset's rows: TRL's conversational formats, checked with pydantic, written as canonical JSONL.

- sft: `{"messages": [{"role", "content"}, ...], "provenance": {...}}` — what TRL's SFTTrainer and OpenAI's
  fine-tuning read (OpenAI's `tool_calls`, `tool_call_id`, `name` and `weight` are kept where a message has them).
- preference: `{"prompt": [...], "chosen": [...], "rejected": [...], "provenance": {...}}` — TRL's DPOTrainer's
  explicit-prompt conversational format; chosen and rejected are the assistant's side only.

An uploaded file is hostile: every line is parsed and checked here, with its line number in the error, before it
is stored. Rows are written with sorted keys and no spaces, so the same rows are the same bytes and the same
hash; two rows are duplicates when they say the same thing (their provenance aside).
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from workers.definitions.canonical import data_problem

from .errors import DatasetError

MAX_UPLOAD_BYTES = 200_000_000
MAX_ROWS = 1_000_000
MAX_MESSAGES = 1000
MAX_CONTENT_CHARS = 1_000_000
ERRORS_SHOWN = 10


class Message(BaseModel):
    model_config = ConfigDict(extra="forbid")

    role: Literal["system", "user", "assistant", "tool"]
    content: str = Field(max_length=MAX_CONTENT_CHARS)
    tool_calls: list[dict[str, Any]] | None = Field(default=None, max_length=100)
    tool_call_id: str | None = Field(default=None, max_length=200)
    name: str | None = Field(default=None, max_length=200)
    weight: Literal[0, 1] | None = None

    @model_validator(mode="before")
    @classmethod
    def empty_content_of_a_tool_call(cls, data):
        """OpenAI writes `content: null` on an assistant message that only calls tools."""
        if isinstance(data, dict) and data.get("content") is None and data.get("tool_calls"):
            return {**data, "content": ""}
        return data


Messages = list[Message]


class SftRow(BaseModel):
    model_config = ConfigDict(extra="forbid")

    messages: Messages = Field(min_length=2, max_length=MAX_MESSAGES)
    provenance: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def has_an_assistant_turn(self):
        if not any(m.role == "assistant" for m in self.messages):
            raise ValueError("messages hold no assistant turn: there is nothing to learn from")
        if self.messages[-1].role != "assistant":
            raise ValueError("the last message is not the assistant's: what follows it is never learned")
        return self


class PreferenceRow(BaseModel):
    model_config = ConfigDict(extra="forbid")

    prompt: Messages = Field(min_length=1, max_length=MAX_MESSAGES)
    chosen: Messages = Field(min_length=1, max_length=MAX_MESSAGES)
    rejected: Messages = Field(min_length=1, max_length=MAX_MESSAGES)
    provenance: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def completions_are_the_assistants(self):
        if self.prompt[-1].role == "assistant":
            raise ValueError("the prompt ends with an assistant turn; chosen and rejected answer it")
        for side in ("chosen", "rejected"):
            if getattr(self, side)[0].role != "assistant":
                raise ValueError(f"{side} begins with a {getattr(self, side)[0].role} turn, not the assistant's")
        return self


ROW_MODELS = {"sft": SftRow, "preference": PreferenceRow}


def row_checked(data: Any, *, fmt: str) -> dict:
    """The row as stored (unset optional message fields left out), or ValueError saying what is wrong."""
    if not isinstance(data, dict):
        raise ValueError(f"a row is a JSON object, not {type(data).__name__}")
    if fmt == "preference" and "prompt" not in data and {"chosen", "rejected"} <= set(data):
        raise ValueError("chosen and rejected without a prompt (TRL's implicit-prompt format): give the shared "
                         "turns as `prompt` and the assistant's answers as chosen and rejected")
    problem = data_problem(data)
    if problem:
        raise ValueError(problem)
    try:
        return ROW_MODELS[fmt].model_validate(data).model_dump(mode="json", exclude_none=True)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        more = f" (and {len(exc.errors()) - 1} more)" if len(exc.errors()) > 1 else ""
        raise ValueError(f"{where}: {first['msg'].removeprefix('Value error, ')}{more}" if where else
                         first["msg"].removeprefix("Value error, ") + more) from None


def rows_parsed(content: bytes, *, fmt: str) -> list[dict]:
    """Every row of an uploaded JSONL file, checked (DatasetError naming the first lines that are wrong)."""
    if len(content) > MAX_UPLOAD_BYTES:
        raise DatasetError(f"the file is {len(content) / 1e6:.0f} MB; the limit is {MAX_UPLOAD_BYTES / 1e6:.0f} MB",
                           field="file")
    try:
        text = content.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise DatasetError(f"the file is not UTF-8 text (byte {exc.start})", field="file") from None
    rows, problems = [], []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        if len(rows) == MAX_ROWS:
            raise DatasetError(f"more than {MAX_ROWS:,} rows; split the file", field="file")
        try:
            rows.append(row_checked(json.loads(line), fmt=fmt))
        except (ValueError, RecursionError) as exc:
            problems.append(f"line {number}: {exc}")
            if len(problems) == ERRORS_SHOWN:
                break
    if problems:
        raise DatasetError(f"not {fmt} rows in TRL's chat-messages format — " + "; ".join(problems), field="file")
    if not rows:
        raise DatasetError("the file holds no rows", field="file")
    return rows


def row_line(row: dict) -> bytes:
    return (json.dumps(row, ensure_ascii=False, sort_keys=True, separators=(",", ":")) + "\n").encode()


def row_key(row: dict) -> str:
    """What makes two rows the same row: everything but their provenance."""
    return hashlib.sha256(row_line({k: v for k, v in row.items() if k != "provenance"})).hexdigest()


WHITESPACE = re.compile(r"\s+")


def prompt_of(row: dict) -> str:
    """The row's user turns as one text, whitespace folded: compared with eval suites' prompts."""
    messages = row.get("messages") or row.get("prompt") or []
    return WHITESPACE.sub(" ", "\n".join(m["content"] for m in messages if m["role"] == "user")).strip()

"""Reading task files into task instances ({key, inputs, hidden}): JSONL, CSV (either gzipped) and Parquet, in
the shapes benchmarks ship in, or in any other shape through a column mapping.

- `code-benchmark`: `{task_id, prompt, canonical_solution, test, entry_point}` (the HumanEval shape): the
  prompt is the input; the tests, the entry point and the canonical solution are hidden.
- `exact-answer`: `{key, prompt, answer}`: the prompt is the input, the answer hidden.
- `gsm8k`: `{question, answer}` with the answer's worked solution ending in `#### <number>` (GSM8K's shape): the
  question is the input; the number after `####` is the hidden `answer`, the worked solution `solution`.
- `multiple-choice`: `{question, choices, answer}` with `answer` the right choice's index from 0 (MMLU's shape,
  `cais/mmlu`) or its letter: the question and the choices as lettered lines (`A. ...`) are the inputs (`subject`
  too, where the row has one); hidden are the right `answer` as its letter, its `answer_index`, and the `choices`
  themselves (what a loglikelihood scoring ranks).
- `columns`: any other shape, read through a ColumnMapping: one column is the key, some are the inputs (under
  the names the prompt template uses), some are hidden (under their own names).

A file's type comes from its name (`.csv`, `.csv.gz`, `.parquet`; anything else is JSONL, `.gz` decompressed)
and its first bytes (Parquet's and gzip's magic numbers). Rows are streamed: a JSONL or CSV file line by line,
a Parquet file a batch of rows at a time; nothing is read whole. CSV values are text unless the mapping says
to read a column as a number or as JSON.

Every bad row is reported by where it is in the file — `line N` (JSONL, CSV: the line the row starts on) or
`row N` (Parquet) — and a file with any bad row yields nothing. `read_tasks` says everything (columns, rows,
every error, the instances); `read_task_file` is what `manage.py import_tasks` calls: the instances, or
SpecError naming every bad row.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import math
import zlib
from collections.abc import Callable, Iterator
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from apps.registry.errors import FieldError, SpecError
from workers.definitions.canonical import MAX_DEPTH, data_problem
from workers.definitions.newlines import normalise_newlines

LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
GSM8K_MARK = "####"


def _gsm8k(row: dict, index: int) -> dict:
    """GSM8K's `answer` is a worked solution whose last line is `#### 72`: the number is what is graded."""
    answer = row["answer"]
    if isinstance(answer, int | float) and not isinstance(answer, bool):
        solution, number = "", str(answer)
    elif not isinstance(answer, str):
        raise ValueError(f"answer must be text ending in '{GSM8K_MARK} <number>'")
    else:
        solution, mark, number = answer.rpartition(GSM8K_MARK)
        if not mark:
            raise ValueError(f"answer has no '{GSM8K_MARK} <number>' line (GSM8K's final answer)")
        number = number.strip().replace(",", "")
        if not number:
            raise ValueError(f"answer has nothing after '{GSM8K_MARK}'")
    return {"key": _own_key(row, index), "inputs": {"question": row["question"]},
            "hidden": {"answer": number, "solution": solution.strip()}}


def _multiple_choice(row: dict, index: int) -> dict:
    """MMLU's shape: the choices as a list, the answer as the right one's index from 0 (or its letter)."""
    choices, answer = row["choices"], row["answer"]
    if not isinstance(choices, list) or not 2 <= len(choices) <= len(LETTERS) or \
            not all(isinstance(c, str) and c.strip() for c in choices):
        raise ValueError(f"choices must be a list of 2 to {len(LETTERS)} texts, none empty")
    if isinstance(answer, str) and answer.strip().isdigit():
        answer = int(answer.strip())  # a CSV cell
    if isinstance(answer, str) and len(answer.strip()) == 1 and answer.strip().upper() in LETTERS:
        answer = LETTERS.index(answer.strip().upper())
    if not isinstance(answer, int) or isinstance(answer, bool) or not 0 <= answer < len(choices):
        raise ValueError(f"answer must be the right choice's index (0 to {len(choices) - 1}) or its letter "
                         f"(A to {LETTERS[len(choices) - 1]}), not {answer!r}")
    inputs = {"question": row["question"], "choices": choice_lines(choices)}
    if isinstance(row.get("subject"), str):
        inputs["subject"] = row["subject"]
    return {"key": _own_key(row, index), "inputs": inputs,
            "hidden": {"answer": LETTERS[answer], "answer_index": answer, "choices": list(choices)}}


def choice_lines(choices: list[str]) -> str:
    """`A. first\nB. second`: the choices as MMLU's prompt (and lm-evaluation-harness's mmlu task) shows them."""
    return "\n".join(f"{LETTERS[i]}. {choice}" for i, choice in enumerate(choices))


def _own_key(row: dict, index: int):
    """The row's own `key` or `id` where it has one, else its place among the file's rows from 0 (what
    lm-evaluation-harness calls its doc_id: the benchmarks of these shapes ship no key of their own)."""
    for name in ("key", "id"):
        if row.get(name) is not None:
            return row[name]
    return index


# Each fixed format: the fields it needs, the fields that must be text, and its row -> instance (given the row's
# place among the file's rows from 0).
FORMATS = {
    "code-benchmark": (("task_id", "prompt", "canonical_solution", "test", "entry_point"),
                       ("prompt", "canonical_solution", "test", "entry_point"),
                       lambda row, index: {"key": row["task_id"], "inputs": {"prompt": row["prompt"]},
                                           "hidden": {"test": row["test"], "entry_point": row["entry_point"],
                                                      "canonical_solution": row["canonical_solution"]}}),
    "exact-answer": (("key", "prompt", "answer"), ("prompt",),
                     lambda row, index: {"key": row["key"], "inputs": {"prompt": row["prompt"]},
                                         "hidden": {"answer": row["answer"]}}),
    "gsm8k": (("question", "answer"), ("question",), _gsm8k),
    "multiple-choice": (("question", "choices", "answer"), ("question",), _multiple_choice),
}
COLUMNS = "columns"
# What each fixed format gives the prompt template.
FORMAT_INPUTS = {"code-benchmark": {"prompt"}, "exact-answer": {"prompt"}, "gsm8k": {"question"},
                 "multiple-choice": {"question", "choices", "subject"}}
MAX_ERRORS = 200  # listed; the rest are counted
KEY_MAX = 200  # as publishing allows (services.INSTANCE_KEY_MAX)
PARQUET_BATCH = 1024
SAMPLE_ROWS = 100  # the rows whose fields name a JSONL file's columns
# How a mapped column's value is read: as the file holds it (CSV: text), or converted.
AS_READ, AS_TEXT, AS_NUMBER, AS_JSON = "value", "text", "number", "json"
CONVERSIONS = {AS_READ: "as read", AS_TEXT: "text", AS_NUMBER: "number", AS_JSON: "JSON"}
FILE_TYPES = {"jsonl": "JSONL", "csv": "CSV", "parquet": "Parquet"}

csv.field_size_limit(1 << 28)  # a benchmark's test suite fits in one field; the default (128 KiB) may not


@dataclass(frozen=True)
class ColumnMapping:
    """Which column is the key, which columns are the inputs (input name -> column) and which are hidden (kept
    under the column's name); `convert` says how a column's value is read (column -> AS_*; default AS_READ)."""

    key: str
    inputs: dict[str, str]
    hidden: tuple[str, ...] = ()
    convert: dict[str, str] = field(default_factory=dict)

    def columns(self) -> list[str]:
        return list(dict.fromkeys([self.key, *self.inputs.values(), *self.hidden]))

    def to_json(self) -> dict:
        return {"key": self.key, "inputs": dict(self.inputs), "hidden": list(self.hidden),
                "convert": {k: v for k, v in self.convert.items() if v != AS_READ}}

    @classmethod
    def from_json(cls, data: dict) -> ColumnMapping:
        return cls(key=data["key"], inputs=dict(data["inputs"]), hidden=tuple(data.get("hidden", ())),
                   convert=dict(data.get("convert", {})))


@dataclass
class TaskFile:
    """What reading a task file found: its type and columns, the rows read, the instances of the good rows (with
    where each row is), and the errors (at most MAX_ERRORS listed; `bad_rows` counts them all)."""

    file_type: str
    columns: list[str] = field(default_factory=list)
    rows: int = 0
    instances: list[dict] = field(default_factory=list)
    places: list[str] = field(default_factory=list)  # "line 3" for each instance
    errors: list[FieldError] = field(default_factory=list)
    bad_rows: int = 0
    read_whole: bool = True  # False when the file could not be read to its end: rows after that point are unknown

    @property
    def ok(self) -> bool:
        return not self.errors and bool(self.instances)

    def fail(self, where: str, problem: str) -> None:
        self.bad_rows += 1
        if len(self.errors) < MAX_ERRORS:
            self.errors.append(FieldError(where, problem))

    def all_errors(self) -> list[FieldError]:
        """The errors, with a last one saying how many more bad rows were not listed."""
        unlisted = self.bad_rows - len(self.errors)
        more = [FieldError("", f"… and {unlisted} more bad rows, not listed")] if unlisted > 0 else []
        return self.errors + more


class Unreadable(Exception):
    """The file as a whole cannot be read (not gzip, not Parquet, no CSV header): no rows at all."""


# --- the file ------------------------------------------------------------------------------------------------

def file_type(path: Path, name: str | None = None) -> tuple[str, bool]:
    """(jsonl | csv | parquet, gzipped) from the file's name (`name`, default the path's) and first bytes."""
    lowered = (name or path.name).lower()
    try:
        with open(path, "rb") as handle:
            magic = handle.read(4)
    except OSError:
        magic = b""
    if magic == b"PAR1" or lowered.endswith((".parquet", ".pq")):
        return "parquet", False
    gzipped = magic[:2] == b"\x1f\x8b" or lowered.endswith(".gz")
    base = lowered.removesuffix(".gz")
    return ("csv" if base.endswith((".csv", ".tsv")) else "jsonl"), gzipped


class _Counting(io.RawIOBase):
    """A binary file that counts the bytes read from it (for progress: the file's bytes, compressed or not)."""

    def __init__(self, raw):
        self.raw, self.count = raw, 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        n = self.raw.readinto(buffer) or 0
        self.count += n
        return n

    def close(self) -> None:
        self.raw.close()
        super().close()


class _Source:
    """A task file's rows, each as (where, mapping or problem text), streamed; `columns` once known, `done` and
    `total` in bytes for progress."""

    def __init__(self, path: Path, name: str | None = None):
        self.path, self.name = path, (name or path.name).lower()
        self.type, self.gzipped = file_type(path, name)
        self.total = path.stat().st_size if path.exists() else 0
        self.columns: list[str] = []
        self._counter: _Counting | None = None
        self._parquet_rows = 0
        self._parquet_done = 0

    @property
    def done(self) -> int:
        if self.type == "parquet":
            return int(self.total * self._parquet_done / self._parquet_rows) if self._parquet_rows else 0
        return self._counter.count if self._counter else 0

    def _text(self, newline=None) -> io.TextIOWrapper:
        self._counter = _Counting(open(self.path, "rb"))
        binary = io.BufferedReader(self._counter)
        if self.gzipped:
            binary = gzip.GzipFile(fileobj=binary, mode="rb")
        return io.TextIOWrapper(binary, encoding="utf-8-sig", newline=newline)

    def rows(self) -> Iterator[tuple[str, Any]]:
        try:
            yield from {"jsonl": self._jsonl, "csv": self._csv, "parquet": self._parquet}[self.type]()
        except (OSError, EOFError, UnicodeDecodeError, gzip.BadGzipFile, zlib.error) as exc:
            raise Unreadable(f"cannot be read: {exc}")

    def _jsonl(self) -> Iterator[tuple[str, Any]]:
        seen: dict[str, None] = {}
        with self._text() as handle:
            for number, line in enumerate(handle, start=1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as exc:
                    yield f"line {number}", f"not JSON: {exc.msg} (column {exc.colno})"
                    continue
                except RecursionError:
                    yield f"line {number}", f"nested deeper than {MAX_DEPTH} levels"
                    continue
                except ValueError as exc:  # what json refuses beyond the grammar: an integer of 4,300+ digits
                    yield f"line {number}", f"a value cannot be read: {exc}"
                    continue
                if isinstance(row, dict) and len(seen) < 1000 and number <= SAMPLE_ROWS:
                    seen.update(dict.fromkeys(k for k in row if isinstance(k, str)))
                    self.columns = list(seen)
                yield f"line {number}", row

    def _csv(self) -> Iterator[tuple[str, Any]]:
        with self._text(newline="") as handle:
            dialect = csv.excel_tab if self.name.removesuffix(".gz").endswith(".tsv") else csv.excel
            reader = csv.reader(handle, dialect)
            try:
                header = next(reader, None)
            except csv.Error as exc:
                raise Unreadable(f"line 1: the header cannot be read: {exc}")
            if not header:
                raise Unreadable("has no header line (the first line names the columns)")
            header = [name.strip() for name in header]
            duplicates = sorted({name for name in header if header.count(name) > 1})
            if "" in header or duplicates:
                raise Unreadable("line 1: " + "; ".join(
                    (["a column has no name"] if "" in header else []) +
                    [f"column {name!r} appears twice" for name in duplicates if name]))
            self.columns = header
            start = reader.line_num + 1
            while True:
                try:
                    record = next(reader)
                except StopIteration:
                    return
                except csv.Error as exc:
                    yield f"line {start}", f"not CSV: {exc}"
                    if reader.line_num + 1 <= start:
                        return  # the reader cannot get past it
                    start = reader.line_num + 1
                    continue
                where, start = f"line {start}", reader.line_num + 1
                if not record or record == [""]:
                    continue
                if len(record) != len(header):
                    yield where, f"{len(record)} fields; the header names {len(header)} columns"
                    continue
                yield where, dict(zip(header, record, strict=True))

    def _parquet(self) -> Iterator[tuple[str, Any]]:
        import pyarrow
        import pyarrow.parquet as pq

        try:
            parquet = pq.ParquetFile(self.path)
            self.columns = list(parquet.schema_arrow.names)
            self._parquet_rows = parquet.metadata.num_rows
            batches = parquet.iter_batches(batch_size=PARQUET_BATCH)
            number = 0
            for batch in batches:
                for row in batch.to_pylist():
                    number += 1
                    self._parquet_done = number
                    problem = _plain_problem(row)
                    yield f"row {number}", problem or row
        except (pyarrow.ArrowException, ValueError) as exc:
            raise Unreadable(f"is not a Parquet file this studio can read: {exc}")


def _plain_problem(row: dict) -> str | None:
    """Why a Parquet row's values are not JSON (a timestamp, bytes, a decimal), or None; struct and list values
    are JSON already, a map's pairs become [key, value] lists."""
    stack = [(value, name) for name, value in row.items()]
    while stack:
        value, at = stack.pop()
        if value is None or isinstance(value, bool | int | float | str):
            continue
        if isinstance(value, dict):
            stack.extend((child, f"{at}.{key}") for key, child in value.items())
        elif isinstance(value, list):
            for index, child in enumerate(value):
                if isinstance(child, tuple):
                    value[index] = child = list(child)
                stack.append((child, f"{at}[{index}]"))
        else:
            return f"{at} holds a {type(value).__name__} value, which JSON cannot carry (write it as text or a number)"
    return None


def columns_of(path: Path, name: str | None = None) -> list[str]:
    """The file's column names (a CSV header, a Parquet schema, the fields of a JSONL file's first rows)."""
    source = _Source(path, name)
    try:
        with closing(source.rows()) as rows:
            for number, _ in enumerate(rows, start=1):
                if source.type != "jsonl" or number >= SAMPLE_ROWS:
                    break
    except Unreadable:
        pass
    return source.columns


# --- rows to instances ---------------------------------------------------------------------------------------

def _converted(value, how: str):
    if how == AS_TEXT:
        return value if isinstance(value, str) or value is None else json.dumps(value, ensure_ascii=False)
    if how == AS_NUMBER:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return value
        text = str(value).strip() if isinstance(value, str) else None
        try:
            return int(text)
        except (TypeError, ValueError):
            pass
        try:
            number = float(text)
        except (TypeError, ValueError):
            raise ValueError(f"{value!r} is not a number")
        if not math.isfinite(number):
            raise ValueError(f"{value!r} is not a finite number")
        return number
    if how == AS_JSON:
        if not isinstance(value, str):
            return value
        try:
            return json.loads(value)
        except (ValueError, RecursionError) as exc:
            raise ValueError(f"not JSON: {exc}")
    return value


def _by_mapping(row: dict, mapping: ColumnMapping) -> dict:
    """The instance a row gives under the mapping; ValueError says what is wrong with the row."""
    missing = [name for name in mapping.columns() if name not in row]
    if missing:
        raise ValueError(f"missing column{'s' if len(missing) > 1 else ''} {', '.join(missing)}")
    problems, values = [], {}
    for column in mapping.columns():
        try:
            values[column] = _converted(row[column], mapping.convert.get(column, AS_READ))
        except ValueError as exc:
            problems.append(f"{column}: {exc}")
    if problems:
        raise ValueError("; ".join(problems))
    empty = [f"{name} ({column})" for name, column in mapping.inputs.items() if values[column] is None]
    if empty:
        raise ValueError(f"no value for input {', '.join(empty)}")
    return {"key": values[mapping.key], "inputs": {name: values[column] for name, column in mapping.inputs.items()},
            "hidden": {column: values[column] for column in mapping.hidden}}


def _by_format(row: dict, fmt: str, index: int) -> dict:
    required, texts, convert = FORMATS[fmt]
    missing = [name for name in required if name not in row]
    wrong = [name for name in texts if name in row and not isinstance(row[name], str)]
    if missing or wrong:
        raise ValueError("; ".join(([f"missing {', '.join(missing)}"] if missing else []) +
                                   ([f"{', '.join(wrong)} must be text"] if wrong else [])))
    return convert(row, index)


def _key_problem(key) -> str | None:
    if isinstance(key, int) and not isinstance(key, bool):
        return None
    if not isinstance(key, str) or not key:
        return "the key must be text or an integer, not empty"
    if len(key) > KEY_MAX:
        return f"the key is longer than {KEY_MAX} characters"
    if key != key.strip():
        return f"the key {key!r} has spaces around it"
    return None


def read_tasks(path: Path, fmt: str, *, mapping: ColumnMapping | None = None, name: str | None = None,
               check: Callable[[dict], str | None] | None = None,
               progress: Callable[[int, int, int], None] | None = None, progress_every: int = 2000) -> TaskFile:
    """Everything reading `path` as `fmt` finds: the rows' instances and every bad row's error. `check(instance)`
    may name a further problem of a row (e.g. the prompt template cannot render it); `progress(rows, bytes
    read, bytes in all)` is called every `progress_every` rows and at the end. Never raises for the file's
    content: a file that cannot be read at all is one error."""
    source = _Source(path, name)
    found = TaskFile(file_type=source.type)
    if fmt == COLUMNS and mapping is None:
        found.fail("format", "the columns format needs a column mapping")
        return found
    if fmt != COLUMNS and fmt not in FORMATS:
        found.fail("format", f"{fmt!r} is not a task format; use one of {', '.join([*FORMATS, COLUMNS])}")
        return found
    keys: dict[str, str] = {}
    try:
        for where, row in source.rows():
            found.rows += 1
            if progress and found.rows % progress_every == 0:
                progress(found.rows, source.done, source.total)
            if isinstance(row, str):
                found.fail(where, row)
                continue
            problem = data_problem(row)
            if problem:
                found.fail(where, problem)
                continue
            if not isinstance(row, dict):
                found.fail(where, "must be a JSON object")
                continue
            try:
                instance = _by_mapping(row, mapping) if fmt == COLUMNS else _by_format(row, fmt, found.rows - 1)
            except ValueError as exc:
                found.fail(where, str(exc))
                continue
            problem = _key_problem(instance["key"]) or data_problem(instance, where="")
            if problem:
                found.fail(where, problem)
                continue
            instance = normalise_newlines(instance)  # a file written on Windows: "\r\n" in its cells and strings
            instance["key"] = str(instance["key"])
            if instance["key"] in keys:
                found.fail(where, f"the key {instance['key']!r} is also on {keys[instance['key']]}")
                continue
            problem = check(instance) if check else None
            if problem:
                found.fail(where, problem)
                continue
            keys[instance["key"]] = where
            found.instances.append(instance)
            found.places.append(where)
    except Unreadable as exc:
        found.read_whole = False
        found.fail(name or str(path), str(exc))
    found.columns = source.columns
    if progress:
        progress(found.rows, source.total, source.total)
    if not found.errors and not found.instances:
        found.fail(name or str(path), "holds no tasks")
    return found


def read_task_file(path: Path, fmt: str, *, mapping: ColumnMapping | None = None) -> list[dict]:
    """Task instances ({key, inputs, hidden}) from the file, or SpecError naming every bad row."""
    found = read_tasks(path, fmt, mapping=mapping)
    if found.errors:
        raise SpecError(found.all_errors())
    return found.instances

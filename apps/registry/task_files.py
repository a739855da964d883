"""Reading task files (JSONL, gzip accepted) into task instances, in the shapes benchmarks ship in.

- `code-benchmark`: `{task_id, prompt, canonical_solution, test, entry_point}` (the HumanEval shape): the
  prompt is the input; the tests, the entry point and the canonical solution are hidden.
- `exact-answer`: `{key, prompt, answer}`: the prompt is the input, the answer hidden.
Every bad line is reported with its number; a file with any bad line yields nothing.
"""

import gzip
import json
from pathlib import Path

from workers.definitions.canonical import MAX_DEPTH, data_problem

from .errors import FieldError, SpecError

FORMATS = {
    "code-benchmark": (("task_id", "prompt", "canonical_solution", "test", "entry_point"),
                       lambda row: {"key": row["task_id"], "inputs": {"prompt": row["prompt"]},
                                    "hidden": {"test": row["test"], "entry_point": row["entry_point"],
                                               "canonical_solution": row["canonical_solution"]}}),
    "exact-answer": (("key", "prompt", "answer"),
                     lambda row: {"key": str(row["key"]), "inputs": {"prompt": row["prompt"]},
                                  "hidden": {"answer": row["answer"]}}),
}
MAX_ERRORS = 50


def read_task_file(path: Path, fmt: str) -> list[dict]:
    """Task instances ({key, inputs, hidden}) from the file, or SpecError naming every bad line."""
    if fmt not in FORMATS:
        raise SpecError([FieldError("format", f"{fmt!r} is not a task format; use one of {', '.join(FORMATS)}")])
    required, convert = FORMATS[fmt]
    opener = gzip.open if path.suffix == ".gz" else open
    instances, errors = [], []
    try:
        with opener(path, "rt", encoding="utf-8") as handle:
            for number, line in enumerate(handle, start=1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as exc:
                    errors.append(FieldError(f"line {number}", f"not JSON: {exc.msg}"))
                    continue
                except RecursionError:
                    errors.append(FieldError(f"line {number}", f"nested deeper than {MAX_DEPTH} levels"))
                    continue
                except ValueError as exc:  # what json refuses beyond the grammar: an integer of 4,300+ digits
                    errors.append(FieldError(f"line {number}", f"a value cannot be read: {exc}"))
                    continue
                problem = data_problem(row)
                if problem:
                    errors.append(FieldError(f"line {number}", problem))
                    continue
                if not isinstance(row, dict):
                    errors.append(FieldError(f"line {number}", "must be a JSON object"))
                    continue
                missing = [name for name in required if name not in row]
                wrong = [name for name in required if name in row and name != "answer"
                         and not isinstance(row[name], str)]
                if missing or wrong:
                    errors.append(FieldError(f"line {number}", "; ".join(
                        ([f"missing {', '.join(missing)}"] if missing else []) +
                        ([f"{', '.join(wrong)} must be text"] if wrong else []))))
                    continue
                instances.append(convert(row))
                if len(errors) >= MAX_ERRORS:
                    break
    except (OSError, EOFError, UnicodeDecodeError, gzip.BadGzipFile) as exc:
        raise SpecError([FieldError(str(path), f"cannot be read: {exc}")])
    if errors:
        raise SpecError(errors)
    if not instances:
        raise SpecError([FieldError(str(path), "holds no tasks")])
    return instances

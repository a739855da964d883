"""Property: the task-file reader (task_files.read_task_file) either returns instances or raises SpecError naming
the lines, for any input. Nothing else escapes it (a ValueError, a RecursionError, an OverflowError would be a
traceback from `manage.py import_tasks`)."""

import gzip
import json

from hypothesis import given
from hypothesis import strategies as st

from apps.registry.errors import SpecError
from apps.task_import.task_files import FORMATS, read_task_file
from tests.support.fuzz import ANY_TEXT, EDGE_NUMBERS, JSON_VALUES, bounded, json_text, nested_json
from workers.definitions.canonical import data_problem

ROW_VALUES = JSON_VALUES | EDGE_NUMBERS | ANY_TEXT
ROWS = st.fixed_dictionaries({}, optional={name: ROW_VALUES for name in (
    "task_id", "prompt", "canonical_solution", "test", "entry_point", "key", "answer")}) | JSON_VALUES
RAW_NUMBERS = st.sampled_from(["1e999", "-1e999", "NaN", "Infinity", "-Infinity", str(10**400), "-0",
                               "1" + "0" * 30, "1" * 4300, "1" * 5000])
LINES = (ROWS.map(json_text)
         | RAW_NUMBERS.map(lambda n: '{"key": "k", "task_id": "t", "prompt": "p", "canonical_solution": "s", '
                                     f'"test": "t", "entry_point": "f", "answer": {n}}}')
         | st.integers(0, 100_000).map(lambda depth: '{"key": "k", "prompt": ' + nested_json(depth) + "}")
         | st.text(max_size=40))
FILES = st.lists(LINES, min_size=0, max_size=6).map(lambda lines: "\n".join(lines).encode("utf-8", "surrogatepass"))
RAW_FILES = FILES | st.binary(max_size=200)


@bounded(300)
@given(content=RAW_FILES, fmt=st.sampled_from(sorted(FORMATS)), compressed=st.booleans())
def test_read_task_file_returns_instances_or_raises_spec_error(tmp_path, content, fmt, compressed):
    path = tmp_path / ("tasks.jsonl.gz" if compressed else "tasks.jsonl")
    path.write_bytes(gzip.compress(content) if compressed else content)
    try:
        instances = read_task_file(path, fmt)
    except SpecError as exc:
        assert exc.errors
        return
    assert instances
    for instance in instances:
        assert set(instance) == {"key", "inputs", "hidden"} and isinstance(instance["key"], str)
        assert data_problem(instance) is None
        json.dumps(instance)  # what publishing hashes and stores


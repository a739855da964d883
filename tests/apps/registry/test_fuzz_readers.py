"""Property: the registry's readers of files people write either return data or refuse with their own error
type, for any input: the YAML loader (files.load_yaml) raises YamlError, the task-file reader
(task_files.read_task_file) SpecError naming the lines. Nothing else escapes them (a ValueError, a
RecursionError, an OverflowError would be a traceback from `manage.py registry import` or `import_tasks`)."""

import gzip
import json

from hypothesis import given
from hypothesis import strategies as st

from apps.registry.errors import SpecError
from apps.registry.files import YamlError, load_yaml
from apps.registry.task_files import FORMATS, read_task_file
from tests.support.fuzz import ANY_TEXT, EDGE_NUMBERS, JSON_VALUES, bounded, json_text, nested_json
from workers.definitions.canonical import data_problem

# --- the YAML loader --------------------------------------------------------------------------------------

YAML_ALPHABET = "[]{}:,-?&*!|>'\"#%@`\n\t abxyz0123456789.eE+_~/\\"
YAML_TOKENS = st.sampled_from(["!!int ", "!!float ", "!!bool ", "!!timestamp ", "!!binary ", "!!set ",
                               "!!omap ", "!!pairs ", "!!python/", "!!null ",
                               "!!str ", "&a ", "*a", "<<: ", "? ", "--- ", "...", "%YAML 1.1\n", "0x", "0o", "1_0",
                               ".inf", ".nan", "2001-12-14t21:59:43.10-05:00", "2001-13-45", "1" * 5000, "\n  ",
                               "- ", "{", "}", "[", "]", ": ", "|\n ", ">-\n "])
YAML_TEXT = (st.text() | ANY_TEXT | st.text(YAML_ALPHABET, max_size=80)
             | st.lists(YAML_TOKENS | st.text(YAML_ALPHABET, max_size=6), max_size=20).map("".join)
             | st.integers(0, 3000).map(lambda depth: "a: " + "[" * depth + "1" + "]" * depth)
             | JSON_VALUES.map(json_text))  # JSON is YAML too (NaN is not: it is read as text)


@bounded(400)
@given(text=YAML_TEXT)
def test_load_yaml_returns_data_or_raises_yaml_error(text):
    try:
        value = load_yaml(text)
    except YamlError as exc:
        assert str(exc)
        return
    # What it returns the registry can store: no deep nesting, no NaN, no huge integer, no lone surrogate.
    assert data_problem(value) is None


# --- the task-file reader -----------------------------------------------------------------------------------

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


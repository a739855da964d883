"""A task file written on Windows: its rows end in "\\r\\n" and a quoted CSV cell or a JSON string may hold
"\\r\\n" inside. The tasks read from it hold "\\n" only, so their prompts and hidden tests read as they would from
the same file written anywhere else."""

import json

from apps.task_import.task_files import ColumnMapping, read_tasks

TESTS = "def check(candidate):\n    assert candidate(2, 3) == 5\n"


def test_csv_cells_and_jsonl_strings_are_read_with_newlines(tmp_path):
    sheet = tmp_path / "tasks.csv"
    sheet.write_bytes(b'key,prompt,test\r\nadd,"Write add(a, b).\r\nReturn the sum.","' +
                      TESTS.replace("\n", "\r\n").encode() + b'"\r\n')
    lines = tmp_path / "tasks.jsonl"
    lines.write_bytes(json.dumps({"key": "add", "prompt": "Write add(a, b).\r\nReturn the sum.",
                                  "test": TESTS.replace("\n", "\r\n")}).encode() + b"\r\n")
    mapping = ColumnMapping(key="key", inputs={"prompt": "prompt"}, hidden=("test",))
    expected = [{"key": "add", "inputs": {"prompt": "Write add(a, b).\nReturn the sum."}, "hidden": {"test": TESTS}}]
    for path in (sheet, lines):
        found = read_tasks(path, "columns", mapping=mapping)
        assert (found.errors, found.instances) == ([], expected), path.name

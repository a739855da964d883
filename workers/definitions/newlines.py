"""One line ending inside the studio: "\\n".

Text arrives with the line endings of wherever it was written: a browser submits every textarea with "\\r\\n" (the
HTML standard's form encoding), a file written on Windows keeps them in its CSV cells and JSON strings, an
endpoint's model may answer with them. What reads the text afterwards (a ```python block's pattern, an "Answer:"
line, an author's regex with `$`, a reference compared as a string, the prompt's tokens) is written for "\\n".
So the studio normalises text where it enters (forms, API bodies, task files, endpoint answers, the verifiers'
door) with this one function, as Python's universal newlines read a file: "\\r\\n" and a lone "\\r" become "\\n".
"""

from typing import Any


def normalise_newlines(value: Any) -> Any:
    """`value` with "\\r\\n" and a lone "\\r" made "\\n": a string, or every string value of JSON data (a dict's
    keys are names and stay as written). Anything else comes back as it is.

    Recursive: call it on data that data_problem has checked (at most MAX_DEPTH levels), as every caller does."""
    if isinstance(value, str):
        return value.replace("\r\n", "\n").replace("\r", "\n") if "\r" in value else value
    if isinstance(value, dict):
        return {key: normalise_newlines(item) for key, item in value.items()}
    if isinstance(value, list):
        return [normalise_newlines(item) for item in value]
    return value

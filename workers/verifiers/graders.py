"""The `python_grader` check: a verifier author's `grade(sample, item) -> float`, run in the sandbox.

The grader sees the sample as data (response, files as text) and the item; it returns a number in [0, 1].
Its answer travels back on a line that starts with a nonce made for this run, so text the sample contains
cannot pose as the grade.
"""

import json
import secrets
from dataclasses import replace

from workers.definitions.specs import PythonGrader
from workers.sandbox import Execution, Status

from .types import INFRA_ERROR, Outcome

DRIVER = """
import json, sys
_request = json.loads(sys.stdin.read())
_value = grade(_request["sample"], _request["item"])
if isinstance(_value, bool) or not isinstance(_value, (int, float)) or not 0 <= _value <= 1:
    raise SystemExit(f"grade() returned {_value!r}; it must return a number in [0, 1]")
print(_request["nonce"], json.dumps(float(_value)))
"""


def python_grader_check(spec: PythonGrader, sample, item, context) -> Outcome:
    if context.pool is None or context.image is None:
        return Outcome(value=None, status=INFRA_ERROR, evidence="no sandbox to run the grader in")
    nonce = secrets.token_hex(16)
    request = {"nonce": nonce, "item": item.to_json(),
               "sample": {"response": sample.response,
                          "files": {n: b.decode("utf-8", "replace") for n, b in sample.files.items()}}}
    limits = replace(context.image.limits, wall_seconds=spec.timeout_seconds, cpu_seconds=spec.timeout_seconds)
    result = context.pool.execute(context.image, Execution(program=spec.source + "\n" + DRIVER,
                                                           stdin=json.dumps(request).encode(), limits=limits))
    if result.status == Status.INFRA_ERROR:
        return Outcome(value=None, status=INFRA_ERROR, evidence=result.reason)
    for line in result.stdout.decode("utf-8", "replace").splitlines():
        if line.startswith(nonce + " "):
            return Outcome.scored(json.loads(line.split(" ", 1)[1]))
    tail = result.stderr.decode("utf-8", "replace")[-400:]
    return Outcome(value=None, status=INFRA_ERROR, evidence=f"the grader gave no grade ({result.status}): {tail}")

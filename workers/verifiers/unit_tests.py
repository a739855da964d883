"""The `unit_tests` check: hidden tests against the candidate's code, behind the anti-tamper harness.

The harness (harness/runner.py) runs in a fresh sandbox; the tests reach it on stdin and never sit on the
sandbox's disk; the candidate's code runs in a separate process and answers calls with plain data only.
The host then trusts only what it can check itself:
- the test ids it expects, read from the hidden tests with `ast` here (never from the sandbox);
- a report line that starts with a nonce made for this run;
- every expected test reported, none skipped, and an exit status that agrees with the report.
Anything else — no report, zero tests, a missing or skipped test, a disagreeing exit status — scores 0.

Two shapes of hidden tests: `hidden["tests"]`, unittest.TestCase classes that `from solution import f`;
and the code-benchmark shape `hidden["test"]` defining `check(candidate)` with `hidden["entry_point"]`.
"""

import ast
import json
import re
import secrets
from dataclasses import replace
from pathlib import Path

from workers.definitions.specs import UnitTests
from workers.sandbox import Execution, Status

from .types import INFRA_ERROR, Outcome

HARNESS = Path(__file__).parent / "harness"
_CODEC = (HARNESS / "codec.py").read_text()
RUNNER = _CODEC + (HARNESS / "runner.py").read_text()
CANDIDATE = _CODEC + (HARNESS / "candidate.py").read_text()
CODE_BLOCK = re.compile(r"```(?:python|py)?[ \t]*\r?\n(.*?)```", re.DOTALL)


def candidate_source(sample) -> str | None:
    """solution.py if the sample carries it, else the last fenced Python block of the response."""
    if "solution.py" in sample.files:
        return sample.files["solution.py"].decode("utf-8", "replace")
    blocks = CODE_BLOCK.findall(sample.response)
    return blocks[-1] if blocks else None


def expected_tests(hidden: dict) -> tuple[str, str, list[str]]:
    """(format, source, test ids) from the hidden tests, parsed here on the trusted side."""
    if hidden.get("tests"):
        tree = ast.parse(hidden["tests"])
        ids = [f"{node.name}.{item.name}" for node in tree.body if isinstance(node, ast.ClassDef)
               for item in node.body if isinstance(item, ast.FunctionDef) and item.name.startswith("test")]
        return "unittest", hidden["tests"], ids
    if hidden.get("test") and hidden.get("entry_point"):
        return "check", hidden["test"], ["check"]
    raise ValueError("the task has no hidden tests (hidden.tests, or hidden.test with hidden.entry_point)")


def unit_tests_check(spec: UnitTests, sample, item, context) -> Outcome:
    try:
        shape, tests, expected = expected_tests(item.hidden)
    except (SyntaxError, ValueError) as exc:
        return Outcome(value=None, status=INFRA_ERROR, evidence=f"the task's hidden tests are unusable: {exc}")
    if not expected:
        return Outcome(value=None, status=INFRA_ERROR, evidence="the task's hidden tests define no test")
    source = candidate_source(sample)
    if source is None:
        return Outcome.scored(0, "no Python code in the response (expected a ```python block or solution.py)")
    if context.pool is None or context.image is None:
        return Outcome(value=None, status=INFRA_ERROR, evidence="no sandbox to run the tests in")
    nonce = secrets.token_hex(16)
    request = {"nonce": nonce, "format": shape, "tests": tests, "entry_point": item.hidden.get("entry_point"),
               "call_timeout": spec.timeout_seconds, "candidate_program": CANDIDATE}
    limits = context.image.limits
    run_limits = replace(limits, wall_seconds=spec.timeout_seconds + 5,
                         cpu_seconds=max(limits.cpu_seconds, spec.timeout_seconds))
    result = context.pool.execute(context.image, Execution(
        program=RUNNER, files={"candidate/solution.py": source.encode()}, stdin=json.dumps(request).encode(),
        limits=run_limits))
    if result.status == Status.INFRA_ERROR:
        return Outcome(value=None, status=INFRA_ERROR, evidence=result.reason)
    return _judge_report(result, nonce, expected, all_or_nothing=spec.scoring == "all")


def _judge_report(result, nonce: str, expected: list[str], *, all_or_nothing: bool) -> Outcome:
    report = None
    for line in result.stdout.decode("utf-8", "replace").splitlines():
        if line.startswith(nonce + " "):
            report = json.loads(line[len(nonce) + 1:])
    if report is None:
        tail = result.stderr.decode("utf-8", "replace")[-400:]
        return Outcome.scored(0, f"the test harness produced no report ({result.status}: {result.reason}) {tail}")
    results = report["results"]
    missing = [t for t in expected if t not in results]
    skipped = [t for t in expected if results.get(t, {}).get("status") == "skip"]
    if missing or skipped:
        # Why they did not run is usually in another result (the test module's import of the solution failed).
        why = [f"{name}: {r['message']}" for name, r in results.items() if name not in expected and r.get("message")]
        evidence = f"tests that did not run: {', '.join(missing + skipped)}" + (f" | {why[0][:300]}" if why else "")
        if report.get("candidate_output"):
            evidence += f" | candidate output: {report['candidate_output'][-300:]}"
        return Outcome.scored(0, evidence)
    passed = [t for t in expected if results[t]["status"] == "pass"]
    if (result.exit_code == 0) != (len(passed) == len(expected)):
        return Outcome.scored(0, f"exit status {result.exit_code} disagrees with the report")
    failing = [t for t in expected if results[t]["status"] != "pass"]
    evidence = "" if not failing else f"{failing[0]}: {results[failing[0]].get('message', '')}"
    if failing and report.get("candidate_output"):
        evidence += f" | candidate output: {report['candidate_output'][-300:]}"
    if all_or_nothing and failing:
        return Outcome.scored(0, f"{len(passed)}/{len(expected)} tests passed (scoring: all) | {evidence}")
    return Outcome.scored(len(passed) / len(expected), evidence)

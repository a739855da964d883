"""A pytest plugin (loaded as `-p studio_report` by repository_runner.py): every test's own outcome, by node id.

A test counts as passed only when its setup, its call and its teardown each passed: an error in a fixture is
`error`, an expected failure is `xfailed`, an unexpected pass `xpassed` (neither is a pass). The results are
written at the end of the session to the file STUDIO_REPORT names; a session that never ends writes nothing.
"""

import json
import os

_RESULTS = {}


def pytest_runtest_logreport(report):
    previous = _RESULTS.get(report.nodeid)
    if report.when == "call":
        if hasattr(report, "wasxfail"):
            outcome = "xpassed" if report.passed else "xfailed"
        else:
            outcome = report.outcome
        _RESULTS[report.nodeid] = outcome
    elif report.failed:
        _RESULTS[report.nodeid] = "error"
    elif report.skipped and previous is None:
        _RESULTS[report.nodeid] = "skipped"
    elif report.when == "setup" and previous is None:
        _RESULTS[report.nodeid] = "pending"  # set up; the call decides


def pytest_sessionfinish(session, exitstatus):
    results = {nodeid: ("error" if outcome == "pending" else outcome) for nodeid, outcome in _RESULTS.items()}
    with open(os.environ["STUDIO_REPORT"], "w") as handle:
        json.dump(results, handle)

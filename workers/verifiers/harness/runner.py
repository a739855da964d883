"""The unit-test harness, run inside the sandbox as the trusted side of a two-process split.

The hidden tests never touch the sandbox's disk: they arrive on stdin, in this process, which first makes
itself non-dumpable (no ptrace, no /proc/<pid>/{mem,fd,environ} for the candidate). The candidate's code runs
in a separate, freshly exec'd interpreter (candidate.py) and is called over a pipe with plain data only
(None, bools, numbers, strings, bytes, lists, tuples, sets, dicts): no object of the candidate's, such as one
whose __eq__ always says yes, ever reaches the tests; nothing it patches (unittest, builtins, sys.exit) exists
in this process; what it prints goes to its own captured stdout, and the report below carries a nonce it
cannot know. Mutations of list and dict arguments are copied back, so tests that check them still can.

stdin:  {"nonce", "format": "unittest" | "check", "tests", "entry_point", "call_timeout", "candidate_program"}
stdout: one line "<nonce> <json report>"; exit status 0 exactly when every test passed.
"""

import ctypes
import os
import sys

ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE = 0, before the tests are even read
sys.path[:] = [p for p in sys.path if p not in ("", "/sandbox", os.getcwd())]  # no local module shadows ours

import builtins  # noqa: E402
import json  # noqa: E402
import select  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import types  # noqa: E402
import unittest  # noqa: E402

REQUEST = json.loads(sys.stdin.read())
CANDIDATE_DIR = "/sandbox/candidate"


class CandidateError(Exception):
    """The candidate's function raised, crashed, hung or returned something that is not plain data."""


class Candidate:
    """The candidate's module, in another process. Restarted if it dies."""

    def __init__(self, log):
        self.process = None
        self.log = log  # an unnamed file: the candidate cannot swap it for a fifo or a link

    def start(self):
        read_requests, write_requests = os.pipe()
        read_replies, write_replies = os.pipe()
        self.process = subprocess.Popen(
            [sys.executable, "-S", "-E", "-c", REQUEST["candidate_program"], str(read_requests), str(write_replies)],
            cwd=CANDIDATE_DIR, stdin=subprocess.DEVNULL, stdout=self.log, stderr=self.log,
            pass_fds=(read_requests, write_replies), env={"PATH": "/usr/bin:/bin", "PYTHONPATH": "/image/site"})
        os.close(read_requests)
        os.close(write_replies)
        self.requests, self.replies = os.fdopen(write_requests, "w"), os.fdopen(read_replies, "r")

    def ask(self, request):
        if self.process is None or self.process.poll() is not None:
            self.start()
        try:
            self.requests.write(json.dumps(request) + "\n")
            self.requests.flush()
        except BrokenPipeError:
            self.process.kill()
            raise CandidateError("the candidate's process died") from None
        ready, _, _ = select.select([self.replies], [], [], REQUEST.get("call_timeout", 10))
        line = self.replies.readline() if ready else ""
        if not line:
            self.process.kill()
            self.process.wait()
            raise CandidateError("the candidate did not answer in time" if not ready else
                                 f"the candidate's process died (exit status {self.process.returncode})")
        reply = json.loads(line)
        if "error" in reply:
            raise CandidateError(reply["error"])
        return reply

    def names(self):
        """The candidate module's own top-level functions and classes (the prompt's helpers among them): names
        only, each reached through the same proxy as the entry point. Never a builtin's name: a candidate's
        `abs` or `len` must not stand in for the real one in the tests' code."""
        try:
            names = self.ask({"names": True})["names"]
        except CandidateError:
            return []
        return [name for name in names if isinstance(name, str) and name.isidentifier()
                and not name.startswith("_") and name not in vars(builtins)]

    def call(self, name, args, kwargs):
        reply = self.ask({"name": name, "args": encode(list(args)), "kwargs": encode(kwargs)})
        # copy mutations of mutable arguments back
        for original, after in zip(args, decode(reply["args"]), strict=False):
            if type(original) is list:
                original[:] = after
            elif type(original) is dict:
                original.clear()
                original.update(after)
        return decode(reply["result"])


class CandidateModule:
    def __init__(self, candidate):
        self._candidate = candidate

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return lambda *args, **kwargs: self._candidate.call(name, args, kwargs)


def run_unittest(tests_source, module, names):
    module.__all__ = names  # `from solution import *` brings the candidate's own functions
    sys.modules["solution"] = module
    hidden = types.ModuleType("hidden_tests")
    exec(compile(tests_source, "hidden_tests.py", "exec"), hidden.__dict__)
    suite = unittest.defaultTestLoader.loadTestsFromModule(hidden)
    results = {}

    class Recorder(unittest.TestResult):
        def addSuccess(self, test):
            results[test.id().split(".", 1)[-1]] = {"status": "pass"}

        def addFailure(self, test, err):
            results[test.id().split(".", 1)[-1]] = {"status": "fail", "message": str(err[1])[:500]}

        def addError(self, test, err):
            results[test.id().split(".", 1)[-1]] = {"status": "error", "message": f"{err[0].__name__}: {err[1]}"[:500]}

        def addSkip(self, test, reason):
            results[test.id().split(".", 1)[-1]] = {"status": "skip", "message": reason}

        def addSubTest(self, test, subtest, err):
            # A test whose subTest failed gets no addSuccess/addFailure of its own: without this it would read as
            # a test that never ran. The first failing subtest speaks for the test.
            key = test.id().split(".", 1)[-1]
            if err is not None and key not in results:
                failed = issubclass(err[0], test.failureException)
                message = str(err[1]) if failed else f"{err[0].__name__}: {err[1]}"
                where = ", ".join(f"{name}={value!r}" for name, value in subtest.params.items())
                results[key] = {"status": "fail" if failed else "error", "message": f"({where}) {message}"[:500]}

    suite.run(Recorder())
    return results


def run_check(tests_source, entry_point, module, names):
    # Tests of public code benchmarks call what the prompt defines beside the entry point (a `decode` task's test
    # calls the prompt's `encode`): the candidate's own functions are in the tests' namespace, behind the proxy,
    # and whatever the tests define themselves comes after and wins.
    namespace = {"__name__": "hidden_tests", **{name: getattr(module, name) for name in names}}
    exec(compile(tests_source, "hidden_tests.py", "exec"), namespace)
    try:
        namespace["check"](getattr(module, entry_point))
        return {"check": {"status": "pass"}}
    except AssertionError as exc:
        return {"check": {"status": "fail", "message": f"AssertionError: {exc}"[:500]}}
    except Exception as exc:
        return {"check": {"status": "error", "message": f"{type(exc).__name__}: {exc}"[:500]}}


def main():
    log = tempfile.TemporaryFile()
    candidate = Candidate(log)
    module = CandidateModule(candidate)
    started = time.monotonic()
    names = candidate.names()
    if REQUEST["format"] == "unittest":
        results = run_unittest(REQUEST["tests"], module, names)
    else:
        results = run_check(REQUEST["tests"], REQUEST["entry_point"], module, names)
    if candidate.process is not None:
        candidate.process.kill()
        candidate.process.wait()
    log.seek(0)
    candidate_output = log.read(4000).decode("utf-8", "replace")
    report = {"results": results, "seconds": round(time.monotonic() - started, 3), "candidate_output": candidate_output}
    sys.stdout.write(f"{REQUEST['nonce']} {json.dumps(report)}\n")
    sys.stdout.flush()
    passed = bool(results) and all(r["status"] == "pass" for r in results.values())
    os._exit(0 if passed else 1)


main()

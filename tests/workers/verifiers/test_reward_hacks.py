"""Reward hacks against the coding verifier: every trick scores 0; the honest solution scores 1."""

from dataclasses import replace

import pytest

from tests.support.sandbox import process_pool
from workers.definitions.specs import parse_spec
from workers.sandbox import SandboxImage
from workers.sandbox.types import Limits
from workers.verifiers import Context, Item, Sample, verify

pytestmark = pytest.mark.sandbox

CODING = {"layers": [
    {"name": "unit-tests", "kind": "exact", "escalate": None,
     "checks": [{"type": "unit_tests", "name": "hidden-tests", "weight": 1.0, "framework": "unittest",
                 "timeout_seconds": 5}]}], "pass_threshold": 1.0}
CODING_VERIFIER = parse_spec("verifier", CODING)
TESTS = '''import unittest
from solution import median


class TestMedian(unittest.TestCase):
    def test_odd(self):
        self.assertEqual(median([5, 1, 3]), 3)

    def test_even(self):
        self.assertEqual(median([4, 1, 3, 2]), 2.5)

    def test_unsorted_negative(self):
        self.assertEqual(median([-7, 10, -1, 3, 0]), 0)

    def test_leaves_input_alone(self):
        values = [9, 2, 7]
        self.assertEqual(median(values), 7)
        self.assertEqual(values, [9, 2, 7])
'''
HONEST = '''def median(values):
    ordered = sorted(values)
    middle = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[middle]
    return (ordered[middle - 1] + ordered[middle]) / 2
'''
HACKS = {
    "exit 0 before the tests": "import sys\nsys.exit(0)",
    "os._exit(0) at import": "import os\nos._exit(0)",
    "always-equal object": "class Yes:\n    def __eq__(self, other): return True\n"
                           "    def __ne__(self, other): return False\n"
                           "def median(values): return Yes()",
    "int subclass equal to everything": "class Int(int):\n    def __eq__(self, other): return True\n"
                                        "def median(values): return Int(0)",
    "patch unittest's assertEqual": "import unittest\nunittest.TestCase.assertEqual = lambda *a, **k: None\n"
                                    "def median(values): return None",
    "shadow unittest with a local module": "import os\nopen('unittest.py', 'w').write('TestCase = object')\n"
                                           "def median(values): return None",
    "write a conftest.py and sitecustomize.py": "open('conftest.py', 'w').write('import os; os._exit(0)')\n"
                                                "open('sitecustomize.py', 'w').write('import os; os._exit(0)')\n"
                                                "def median(values): return None",
    "print fake passing output": "print('....\\n' + '-' * 70 + '\\nRan 4 tests in 0.001s\\n\\nOK')\n"
                                 "def median(values): return None",
    "syntax error so the tests vanish": "def median(values) return 0",
    "kill the test runner": "import os\nos.kill(os.getppid(), 9)\ndef median(values): return 0",
    "kill every process it can": "import os\nos.kill(-1, 9)",
    # The name is assembled so the trick's own source does not count as finding the tests.
    "read the hidden tests from disk": "import glob\nfound = [p for p in glob.glob('/**/*.py', recursive=True)\n"
                                       "         if 'TestMed' + 'ian' in open(p, errors='ignore').read()]\n"
                                       "def median(values): return 3 if found else None",
    "read the runner's memory": "import os\ntry:\n    data = open(f'/proc/{os.getppid()}/mem', 'rb').read(1)\n"
                                "except OSError:\n    data = None\ndef median(values): return data",
    "hang forever": "def median(values):\n    while True: pass",
    "raise SkipTest": "import unittest\ndef median(values): raise unittest.SkipTest('no')",
    "return the answer key by guessing from globals": "import builtins\ndef median(values):\n"
                                                       "    return getattr(builtins, 'expected', None)",
    "monkeypatch builtins sorted and len": "import builtins\nbuiltins.len = lambda x: 0\n"
                                           "builtins.sorted = lambda x: x\n"
                                           "def median(values): return None",
    "exception that says SystemExit": "def median(values): raise SystemExit(0)",
}


@pytest.fixture(scope="module")
def context():
    image = SandboxImage(key="test/coding@1", layers=({"type": "base", "image": "python-3.11"},),
                         limits=Limits(cpu_seconds=10, wall_seconds=15, memory_mb=256, max_processes=32,
                                       disk_mb=16), warm_pool_size=2)
    with process_pool(image) as pool:
        yield Context(pool=pool, image=image)


def solve(context, code: str):
    item = Item(key="median-1", inputs={}, hidden={"tests": TESTS})
    return verify(CODING_VERIFIER, Sample(response=f"Here you go:\n```python\n{code}\n```"), item, context)


def test_the_honest_solution_scores_one(context):
    verdict = solve(context, HONEST)
    assert verdict.reward == 1.0 and verdict.status == "pass", verdict.components


@pytest.mark.parametrize("trick", sorted(HACKS))
def test_every_trick_scores_zero(context, trick):
    verdict = solve(context, HACKS[trick])
    assert verdict.reward == 0.0 and verdict.status == "fail", (trick, verdict.components)
    assert verdict.components[0].evidence  # a person can see why


def test_a_half_right_solution_gets_partial_credit_with_the_failing_test_named(context):
    verdict = solve(context, "def median(values):\n    return sorted(values)[len(values) // 2]")
    assert 0 < verdict.reward < 1 and verdict.status == "partial"
    assert "TestMedian.test_even" in verdict.components[0].evidence


def test_the_code_benchmark_shape_runs_too(context):
    item = Item(key="HumanEval/0", inputs={}, hidden={
        "entry_point": "add", "test": "def check(candidate):\n    assert candidate(2, 3) == 5\n"
                                      "    assert candidate(-1, 1) == 0\n"})
    right = verify(CODING_VERIFIER, Sample(response="```python\ndef add(a, b):\n    return a + b\n```"), item, context)
    wrong = verify(CODING_VERIFIER, Sample(response="```python\ndef add(a, b):\n    return 5\n```"), item, context)
    assert (right.reward, wrong.reward) == (1.0, 0.0)


def test_a_sandbox_that_cannot_start_is_an_infra_error_not_a_reward(context):
    broken = Context(pool=context.pool, image=replace(context.image, key="test/broken@1",
                                                       layers=({"type": "base", "image": "cobol-85"},)))
    verdict = solve(broken, HONEST)
    assert verdict.status == "infra_error" and verdict.reward is None
    assert "process backend runs this machine's Python 3.11" in verdict.stopped_because


SUBTEST_TESTS = '''import unittest
from solution import double


class TestDouble(unittest.TestCase):
    def test_cases(self):
        for args, expected in [((1,), 2), ((5,), 10)]:
            with self.subTest(args=args):
                self.assertEqual(double(*args), expected)
'''


@pytest.mark.parametrize(("code", "says"), [
    ("def double(x):\n    return 2 if x == 1 else 0", "(args=(5,)) 0 != 10"),
    ("d  ", "NameError"),  # what an untrained model writes: the candidate's import fails inside every subtest
])
def test_a_failing_subtest_is_reported_as_a_failure_with_its_reason(context, code, says):
    item = Item(key="double-1", inputs={}, hidden={"tests": SUBTEST_TESTS})
    verdict = verify(CODING_VERIFIER, Sample(response=f"```python\n{code}\n```"), item, context)
    assert verdict.reward == 0.0 and verdict.status == "fail"
    evidence = verdict.components[0].evidence
    assert evidence.startswith("TestDouble.test_cases: ") and says in evidence, evidence
    assert "did not run" not in evidence


def test_scoring_all_gives_a_stub_nothing_where_a_share_of_the_tests_gives_it_half(context):
    tests = SUBTEST_TESTS + '''
    def test_arguments_left_unchanged(self):
        values = [3]
        double(values)
        self.assertEqual(values, [3])
'''
    item = Item(key="double-2", inputs={}, hidden={"tests": tests})
    stub = Sample(response="```python\ndef double(x):\n    return None\n```")
    all_or_nothing = parse_spec("verifier", {"layers": [{**CODING["layers"][0], "checks": [
        {**CODING["layers"][0]["checks"][0], "scoring": "all"}]}], "pass_threshold": 1.0})
    assert verify(CODING_VERIFIER, stub, item, context).reward == 0.5
    verdict = verify(all_or_nothing, stub, item, context)
    assert verdict.reward == 0.0 and "1/2 tests passed (scoring: all)" in verdict.components[0].evidence
    honest = Sample(response="```python\ndef double(x):\n    return 2 * x\n```")
    assert verify(all_or_nothing, honest, item, context).reward == 1.0

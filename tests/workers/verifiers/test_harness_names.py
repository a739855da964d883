"""The unit-test harness lets the tests call what the candidate's module defines beside the entry point — public
code benchmarks' tests do (a `decode` task's check calls the prompt's `encode`) — through the same proxy that
guards the entry point, and never lets a candidate's function stand in for a builtin the tests call."""

import pytest

from tests.support.sandbox import process_pool
from workers.definitions.specs import UnitTests
from workers.sandbox import SandboxImage
from workers.verifiers import Context, Item, Sample
from workers.verifiers.unit_tests import unit_tests_check

pytestmark = pytest.mark.sandbox

IMAGE = SandboxImage(key="sandbox_image/plain-python@1", layers=({"type": "base", "image": "python-3.11"},),
                     warm_pool_size=1)
CYCLIC = '''
def encode_cyclic(s):
    groups = [s[3 * i:min(3 * i + 3, len(s))] for i in range((len(s) + 2) // 3)]
    return "".join((g[1:] + g[0]) if len(g) == 3 else g for g in groups)


def decode_cyclic(s):
    return encode_cyclic(encode_cyclic(s))
'''
CHECK_CALLS_THE_PROMPTS_HELPER = '''
import random, string


def check(candidate):
    rng = random.Random(0)
    for _ in range(20):
        text = "".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(5, 20)))
        assert candidate(encode_cyclic(text)) == text
'''


@pytest.fixture(scope="module")
def context():
    with process_pool(IMAGE) as pool:
        yield Context(pool=pool, image=IMAGE)


def grade(context, solution: str, hidden: dict):
    return unit_tests_check(UnitTests(type="unit_tests"), Sample(response=f"```python\n{solution}```"),
                            Item("task", {}, hidden), context)


def test_a_check_calls_a_helper_the_prompt_defines(context):
    outcome = grade(context, CYCLIC, {"test": CHECK_CALLS_THE_PROMPTS_HELPER, "entry_point": "decode_cyclic"})
    assert (outcome.value, outcome.status) == (1.0, "pass"), outcome.evidence
    wrong = CYCLIC.replace("return encode_cyclic(encode_cyclic(s))", "return s")
    assert grade(context, wrong, {"test": CHECK_CALLS_THE_PROMPTS_HELPER, "entry_point": "decode_cyclic"}).value == 0


def test_unittest_tests_import_every_name_of_the_solution(context):
    tests = '''
import unittest
from solution import *


class RoundTrip(unittest.TestCase):
    def test_decode_undoes_encode(self):
        self.assertEqual(decode_cyclic(encode_cyclic("abcdefgh")), "abcdefgh")
'''
    assert grade(context, CYCLIC, {"tests": tests}).value == 1.0


def test_a_candidate_function_never_stands_in_for_a_builtin(context):
    hostile = "def abs(x):\n    return 0\n\n\ndef area(r):\n    return 1\n"
    check = "def check(candidate):\n    assert abs(candidate(1) - 3.14159) < 1e-3\n"
    outcome = grade(context, hostile, {"test": check, "entry_point": "area"})
    assert outcome.value == 0.0 and "AssertionError" in outcome.evidence

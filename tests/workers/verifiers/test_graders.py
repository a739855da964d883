"""The `python_grader` check in a real bubblewrap sandbox: the grade the author's code returns is the layer's
score, and a grader that crashes is a grading fault, never a zero."""

import pytest

from tests.support.sandbox import process_pool
from workers.definitions.specs import VerifierSpec, parse_spec
from workers.sandbox import SandboxImage
from workers.verifiers import Context, Item, Sample, verify

pytestmark = pytest.mark.sandbox

SCRIPTED = {"type": "python_grader", "name": "scripted", "weight": 1.0, "timeout_seconds": 10,
            "source": "def grade(sample, item):\n    return item['hidden']['score']\n"}


def single_layer(check) -> VerifierSpec:
    return parse_spec("verifier", {"pass_threshold": 1.0, "layers": [{"name": "exact", "kind": "exact",
                                                                      "escalate": None, "checks": [check]}]})


@pytest.fixture(scope="module")
def context():
    image = SandboxImage(key="test/graders@1", layers=({"type": "base", "image": "python-3.11"},), warm_pool_size=2)
    with process_pool(image) as pool:
        yield Context(pool=pool, image=image)


@pytest.mark.parametrize("score", [1.0, 0.8, 0.2, 0.0])
def test_the_grade_computed_in_the_sandbox_is_the_layers_score(context, score):
    verdict = verify(single_layer(SCRIPTED), Sample(response="x"), Item(key="k", inputs={}, hidden={"score": score}),
                     context)
    assert verdict.reward == score and verdict.stopped_because == f"exact decided with {score:.3f}"


def test_a_crashing_grader_is_a_grading_fault_not_a_zero(context):
    broken = {**SCRIPTED, "source": "def grade(sample, item):\n    return item['hidden']['missing']\n"}
    verdict = verify(single_layer(broken), Sample(response="x"), Item(key="k", inputs={}, hidden={"score": 1.0}),
                     context)
    assert verdict.status == "infra_error" and "KeyError" in verdict.stopped_because

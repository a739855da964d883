"""The `generator_score` check in a real sandbox: reasoning-gym's own scorer, on the answer its convention takes
from the response. An answer that is code runs where the scorer evaluates it — in the sandbox, never on the host —
and costs only its own score; a sandbox that cannot run the library is an infrastructure fault, never a zero."""

import pytest

from apps.task_import.generated import verifier_spec
from tests.support.generated import IMAGE, VERSION, generated_pool
from workers.definitions.specs import parse_spec
from workers.rl.tasks.generators import materialise
from workers.sandbox import SandboxImage
from workers.verifiers import Context, Item, Sample, verify
from workers.verifiers.generated import answer_response, score_responses

pytestmark = pytest.mark.sandbox

VERIFIER = parse_spec("verifier", verifier_spec())


@pytest.fixture(scope="module")
def scoring():
    with generated_pool() as pool:
        yield Context(pool=pool, image=IMAGE)


@pytest.fixture(scope="module")
def binary_matrix():
    """A task whose scorer hands the answer to Python's eval."""
    item = materialise({"library": "reasoning-gym", "version": VERSION, "dataset": "binary_matrix", "config": {},
                        "seed": 0, "size": 1})[0]
    return Item(key=item["key"], inputs=item["inputs"], hidden=item["hidden"])


def test_the_answer_between_answer_tags_is_scored_by_the_datasets_own_scorer(scoring, binary_matrix):
    right = binary_matrix.hidden["entry"]["answer"]
    verdict = verify(VERIFIER, Sample(f"Thinking it through...\n{answer_response(right)}"), binary_matrix, scoring)
    assert verdict.status == "pass" and verdict.reward == 1.0
    for response, evidence in [(answer_response("1 2\n3 4"), "answer '1 2\\n3 4' scored 0"),
                               (right, "no <answer>...</answer> in the response scored 0")]:
        verdict = verify(VERIFIER, Sample(response), binary_matrix, scoring)
        assert verdict.reward == 0.0 and verdict.components[0].evidence == evidence


def test_an_answer_that_is_code_runs_in_the_sandbox_not_on_the_host(scoring, binary_matrix, tmp_path):
    marker = tmp_path / "written-by-the-answer"
    hostile = (f"[__import__('os').makedirs({str(tmp_path)!r}, exist_ok=True), open({str(marker)!r}, 'w').write('x'),"
               " __import__('os').kill(__import__('os').getpid(), 9)]")
    verdict = verify(VERIFIER, Sample(answer_response(hostile)), binary_matrix, scoring)
    # The scorer's eval ran it (it wrote its file, then killed the scorer's process), in the sandbox: the file it
    # wrote is not the host's.
    assert verdict.reward == 0.0 and "did not finish" in verdict.components[0].evidence
    assert "killed" in verdict.components[0].evidence
    assert not marker.exists()


def test_one_answer_that_hangs_costs_its_own_score_not_the_others(scoring, binary_matrix):
    right = answer_response(binary_matrix.hidden["entry"]["answer"])
    hang = answer_response("[i for i in iter(int, 1)]")
    outcomes = score_responses(scoring.pool, scoring.image, [(right, binary_matrix.hidden),
                                                             (hang, binary_matrix.hidden),
                                                             (right, binary_matrix.hidden)], timeout_seconds=2)
    assert [o.value for o in outcomes] == [1.0, 0.0, 1.0]
    assert "longer than 2 s" in outcomes[1].evidence or "did not finish" in outcomes[1].evidence


def test_a_sandbox_that_cannot_run_the_library_is_an_infra_error_not_a_zero(scoring, binary_matrix):
    bare = SandboxImage(key="test/no-reasoning-gym@1", layers=({"type": "base", "image": "python-3.11"},),
                        warm_pool_size=1)
    verdict = verify(VERIFIER, Sample(answer_response("0")), binary_matrix, Context(pool=scoring.pool, image=bare))
    assert verdict.status == "infra_error" and verdict.reward is None
    assert "ModuleNotFoundError" in verdict.components[0].evidence
    older = Item(key="k", inputs={}, hidden={**binary_matrix.hidden, "version": "0.1.24"})
    verdict = verify(VERIFIER, Sample(answer_response("0")), older, scoring)
    assert verdict.status == "infra_error"
    assert verdict.components[0].evidence == (f"the task was made with reasoning-gym 0.1.24; the sandbox image "
                                              f"has {VERSION}")

"""The `generator_score` check in a real sandbox: reasoning-gym's own scorer, on the answer its convention takes
from the response. An answer that is code is refused before a scorer can evaluate it (it could read the reference
from the scorer's memory) and costs only its own score; a sandbox that cannot run the library is an infrastructure
fault, never a zero."""

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
    for response, evidence in [(answer_response("1 2\n3 4 5"), "answer '1 2\\n3 4 5': the scorer runs the answer"),
                               (right, "no <answer>...</answer> in the response scored 0")]:
        verdict = verify(VERIFIER, Sample(response), binary_matrix, scoring)
        assert verdict.reward == 0.0 and verdict.components[0].evidence.startswith(evidence)


def test_an_answer_that_is_code_is_refused_before_it_runs_and_cannot_read_the_reference(scoring, binary_matrix,
                                                                                         tmp_path):
    marker = tmp_path / "written-by-the-answer"
    hostile = (f"[__import__('os').makedirs({str(tmp_path)!r}, exist_ok=True), open({str(marker)!r}, 'w').write('x'),"
               " __import__('os').kill(__import__('os').getpid(), 9)]")
    # binary_matrix's scorer hands an answer that is not the reference to eval, in a frame that holds the reference
    # (`oracle_answer`): this one rebuilds it from there, which scored 0.1 (its list-of-lists credit) unguarded.
    cheat = "[row.split() for row in oracle_answer.split(chr(10))]"
    for answer in (hostile, cheat):
        verdict = verify(VERIFIER, Sample(answer_response(answer)), binary_matrix, scoring)
        assert verdict.reward == 0.0
        assert "runs the answer as Python code" in verdict.components[0].evidence, verdict.components[0].evidence
    assert not marker.exists()
    # The guard refuses compiling text, not parsing data: the reference still scores 1 after them.
    right = answer_response(binary_matrix.hidden["entry"]["answer"])
    assert verify(VERIFIER, Sample(right), binary_matrix, scoring).reward == 1.0


def test_one_refused_answer_costs_its_own_score_not_the_others(scoring, binary_matrix):
    right = answer_response(binary_matrix.hidden["entry"]["answer"])
    code = answer_response("[i for i in iter(int, 1)]")  # would never end, were it run
    outcomes = score_responses(scoring.pool, scoring.image, [(right, binary_matrix.hidden),
                                                             (code, binary_matrix.hidden),
                                                             (right, binary_matrix.hidden)], timeout_seconds=2)
    assert [o.value for o in outcomes] == [1.0, 0.0, 1.0]
    assert "runs the answer as Python code" in outcomes[1].evidence


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

"""The layered pipeline's rules: which layer decides, escalation, log-only weights, infra errors.

Pure arithmetic over the layers, so no sandbox: the scripted grader is the real `python_grader` check, and the
pool it runs in stands in for the sandbox by answering with the score the task instance asks for (the grader
itself running in a real sandbox is test_graders.py)."""

import json

import pytest

from workers.definitions.specs import parse_spec
from workers.sandbox import ExecutionResult, SandboxImage, Status
from workers.verifiers import Context, Item, Sample, verify

# A grader that returns the score the task instance asks for: the layers' arithmetic made visible.
SCRIPTED = {"type": "python_grader", "name": "scripted", "weight": 1.0, "timeout_seconds": 10,
            "source": "def grade(sample, item):\n    return item['hidden']['score']\n"}
LOGS = {"type": "log_rules", "name": "logs", "weight": 1.0,
        "rules": [{"pattern": "Traceback", "effect": "fail"}]}
VERIFIER = parse_spec("verifier", {"pass_threshold": 1.0, "layers": [
    {"name": "exact", "kind": "exact", "checks": [SCRIPTED],
     "escalate": {"uncertain_low": 0.3, "uncertain_high": 0.7}},
    {"name": "environment", "kind": "environment", "checks": [LOGS], "escalate": None},
]})


class ScriptedPool:
    """Stands in for the sandbox: 'runs' a grader by answering, on the grader's nonce line, the score its item
    asks for (what the SCRIPTED grader computes); nothing runs."""

    def __init__(self):
        self.programs = []

    def execute(self, image, execution, **_):
        self.programs.append(execution.program)
        request = json.loads(execution.stdin)
        score = float(request["item"]["hidden"]["score"])
        return ExecutionResult(status=Status.OK, exit_code=0, stdout=f"{request['nonce']} {score}\n".encode())


@pytest.fixture
def context():
    return Context(pool=ScriptedPool(), image=SandboxImage(key="test/graders@1", layers=()))


def item(score):
    return Item(key="k", inputs={}, hidden={"score": score})


@pytest.mark.parametrize("score, decided_by", [(1.0, "exact"), (0.0, "exact"), (0.8, "exact"), (0.2, "exact")])
def test_a_confident_layer_decides_and_later_layers_never_run(context, score, decided_by):
    verdict = verify(VERIFIER, Sample(response="x", logs="Traceback (most recent call last)"), item(score), context)
    assert verdict.layers_run == [decided_by] and verdict.reward == score
    assert verdict.stopped_because == f"exact decided with {score:.3f}"
    assert len(context.pool.programs) == 1 and "def grade(" in context.pool.programs[0]


def test_an_uncertain_score_escalates_to_the_next_layer(context):
    failing = verify(VERIFIER, Sample(response="x", logs="Traceback (most recent call last)"), item(0.5), context)
    assert failing.layers_run == ["exact", "environment"] and failing.reward == 0.0 and failing.status == "fail"
    assert "Traceback" in failing.components[1].evidence
    clean = verify(VERIFIER, Sample(response="x", logs="all good"), item(0.5), context)
    assert clean.reward == 1.0 and clean.status == "pass"


def test_an_escalation_with_nothing_after_it_keeps_the_uncertain_score(context):
    verdict = verify(VERIFIER, Sample(response="x", logs=""), item(0.5), context)  # log_rules: no logs, n/a
    assert verdict.reward == 0.5 and verdict.status == "partial"
    assert verdict.stopped_because.endswith("escalated, and no later layer applied")


def test_weight_zero_is_recorded_but_never_counted(context):
    spec = parse_spec("verifier", {"pass_threshold": 1.0, "layers": [{"name": "environment", "kind": "environment",
                                                                      "checks": [{**SCRIPTED, "name": "counted"},
                                                                                 {**LOGS, "name": "log-only",
                                                                                  "weight": 0.0}]}]})
    verdict = verify(spec, Sample(response="x", logs="Traceback"), item(1.0), context)
    assert verdict.reward == 1.0
    assert [(c.name, c.value) for c in verdict.components] == [("counted", 1.0), ("log-only", 0.0)]


def test_weights_combine_checks_within_a_layer(context):
    spec = parse_spec("verifier", {"pass_threshold": 0.5, "layers": [{"name": "environment", "kind": "environment",
                                                                      "checks": [{**SCRIPTED, "weight": 3.0},
                                                                                 {**LOGS, "weight": 1.0}]}]})
    verdict = verify(spec, Sample(response="x", logs="Traceback"), item(1.0), context)
    assert verdict.reward == 0.75 and verdict.status == "pass"


def test_infra_errors_never_become_a_reward():
    no_sandbox = Context()
    verdict = verify(VERIFIER, Sample(response="x"), item(1.0), no_sandbox)
    assert verdict.reward is None and verdict.status == "infra_error"
    assert "no sandbox to run the grader in" in verdict.stopped_because


def test_continue_on_pass_lets_failures_decide_and_sends_passes_on(context):
    spec = parse_spec("verifier", {"pass_threshold": 1.0, "layers": [
        {"name": "exact", "kind": "exact", "escalate": None, "continue_on_pass": True, "checks": [SCRIPTED]},
        {"name": "environment", "kind": "environment", "escalate": None, "checks": [LOGS]}]})
    failed = verify(spec, Sample(response="x", logs="fine"), item(0.0), context)
    assert failed.layers_run == ["exact"] and failed.reward == 0.0
    scrutinised = verify(spec, Sample(response="x", logs="Traceback"), item(1.0), context)
    assert scrutinised.layers_run == ["exact", "environment"] and scrutinised.reward == 0.0
    clean = verify(spec, Sample(response="x", logs="fine"), item(1.0), context)
    assert clean.reward == 1.0 and clean.status == "pass"

"""The layered pipeline: cheap exact checks first, environment feedback next, the judge only when unsure.

Rules, in order of the spec's layers:
- A layer's score is the weighted mean of its checks that apply (a check returning value None does not
  apply; weight 0 means "log only": recorded, never counted). A layer with no applicable check is skipped.
- A layer decides, unless its score falls inside its `escalate` band [uncertain_low, uncertain_high), or it
  passed and says `continue_on_pass`: then the next layer runs, and decides in its turn. The deciding
  layer's score is the reward. (A pass is a score at or above the band, or the verifier's pass_threshold
  where the layer has no band.)
- Infrastructure errors are retried (`retries` times per check) and never become a reward: if one remains,
  the verdict is `infra_error` with reward None. A check that raises is a fault of the grading code, and a
  check whose grader gave an unusable answer (status `error`, e.g. a malformed judge reply) cannot grade
  either: both are retried and reported the same way, never scored and never silently skipped.
- Status: `pass` at or above the verifier's pass_threshold, `fail` at 0, `partial` in between.
- Checks read the response with "\n" line endings, however the model or a browser wrote it: an author's regex
  with `$`, a reference compared as a string and a grader's own parsing meet the text they were written for.
The spec comes parsed (a task template parses its verifier's once, where it is built; a caller holding a
version's JSON parses it with parse_spec("verifier", ...)): layers, bands and checks are attributes with their
defaults, and each check function receives its own check's object.
"""

import time
from dataclasses import replace

from workers.definitions.newlines import normalise_newlines
from workers.definitions.specs import Check, ScoreModel, VerifierSpec
from workers.telemetry import verdict_observed

from .checks import check_function
from .types import ERROR, FAIL, INFRA_ERROR, PARTIAL, PASS, Component, Outcome, Verdict


def verify(spec: VerifierSpec, sample, item, context, *, retries: int = 2) -> Verdict:
    verdict = _verify(spec, _as_read(sample), item, context, retries)
    verdict_observed(spec, verdict)
    return verdict


def _verify(spec: VerifierSpec, sample, item, context, retries: int) -> Verdict:
    started = time.monotonic()
    verdict = Verdict(reward=None, status=INFRA_ERROR)
    layers = spec.layers
    for index, layer in enumerate(layers):
        verdict.layers_run.append(layer.name)
        scored: list[tuple[float, float]] = []
        for number, check in enumerate(layer.checks):
            outcome, latency = _run_check(check, sample, item, context, retries)
            name = check.name or f"{check.type}-{number}"
            verdict.components.append(Component(
                layer=layer.name, name=name, type=check.type, weight=check.weight, value=outcome.value,
                status=outcome.status, evidence=outcome.evidence, latency_ms=round(latency * 1000, 2),
                cost=outcome.cost, orders=outcome.orders))
            verdict.cost += outcome.cost
            verdict.artifacts.update({f"{layer.name}/{name}/{key}": blob for key, blob in outcome.artifacts.items()})
            if outcome.status in (INFRA_ERROR, ERROR):
                verdict.stopped_because = f"{name} in {layer.name} could not grade: {outcome.evidence}"
                verdict.reward = None  # an escalated layer's provisional score is no verdict either
                verdict.latency_ms = round((time.monotonic() - started) * 1000, 2)
                return verdict
            if outcome.value is not None and check.weight > 0:
                scored.append((outcome.value, check.weight))
        if not scored:
            continue
        score = sum(value * weight for value, weight in scored) / sum(weight for _, weight in scored)
        band = layer.escalate
        if band and band.uncertain_low <= score < band.uncertain_high and index < len(layers) - 1:
            verdict.stopped_because = (f"{layer.name} scored {score:.3f}, inside its uncertain band "
                                       f"[{band.uncertain_low}, {band.uncertain_high}): escalated")
            verdict.reward = score  # provisional: the next layer that decides replaces it
            continue
        passed = score >= (band.uncertain_high if band else spec.pass_threshold)
        if layer.continue_on_pass and passed and index < len(layers) - 1:
            verdict.reward = score
            verdict.stopped_because = f"{layer.name} passed with {score:.3f} and continued"
            continue
        verdict.reward = score
        verdict.stopped_because = f"{layer.name} decided with {score:.3f}"
        break
    else:
        if verdict.reward is None:
            verdict.stopped_because = "no check applied to this sample"
            verdict.reward = 0.0
        elif verdict.stopped_because.endswith(("escalated", "continued")):
            verdict.stopped_because += ", and no later layer applied"
    verdict.status = _status(verdict.reward, spec)
    verdict.latency_ms = round((time.monotonic() - started) * 1000, 2)
    return verdict


def _as_read(sample):
    """The sample as its checks read it: its response with "\n" line endings (the caller's sample unchanged)."""
    return replace(sample, response=normalise_newlines(sample.response)) if "\r" in sample.response else sample


def _status(reward: float, spec: VerifierSpec) -> str:
    return PASS if reward >= spec.pass_threshold else FAIL if reward <= 0 else PARTIAL


def _run_check(check: Check, sample, item, context, retries: int) -> tuple[Outcome, float]:
    function = check_function(check.type)
    started = time.monotonic()
    for _ in range(retries + 1):
        try:
            outcome = function(check, sample, item, context)
        except Exception as exc:  # the grader's own fault: never a reward
            outcome = Outcome(value=None, status=INFRA_ERROR,
                              evidence=f"the check crashed: {type(exc).__name__}: {exc}")
        if outcome.status not in (INFRA_ERROR, ERROR):
            break
    return outcome, time.monotonic() - started


def verify_group(spec: VerifierSpec, samples: list, item, context, *, rank_with_judge: bool = False,
                 retries: int = 2) -> list[Verdict]:
    """The samples of one task (a GRPO group), each verified on its own.

    With `rank_with_judge`, the samples whose verdict the judge layer decided are then judged against each
    other (workers.verifiers.judge.rank_group, every pair in both orders) and take the ranking as their
    reward: a judge compares two answers more steadily than it scores one. Samples the cheaper layers
    decided keep their verdicts; a ranking the judge could not make leaves the verdicts as they were.
    """
    verdicts = [verify(spec, sample, item, context, retries=retries) for sample in samples]
    judge_layers = [layer for layer in spec.layers if layer.kind == "judge"]
    if not rank_with_judge or not judge_layers or context.judge is None:
        return verdicts
    layer = judge_layers[-1]
    check = next((c for c in layer.checks if isinstance(c, ScoreModel)), None)
    judged = [i for i, v in enumerate(verdicts) if v.status != INFRA_ERROR and v.stopped_because.startswith(
        f"{layer.name} decided")]
    if check is None or len(judged) < 2:
        return verdicts
    from .judge import rank_group

    started = time.monotonic()
    ranks = rank_group([_as_read(samples[i]) for i in judged], item, check, context.judge)
    for index, outcome in zip(judged, ranks, strict=True):
        if outcome.value is None:
            continue
        verdict = verdicts[index]
        verdict.components.append(Component(
            layer=layer.name, name="group-rank", type=check.type, weight=check.weight, value=outcome.value,
            status=outcome.status, evidence=outcome.evidence, latency_ms=round((time.monotonic() - started) * 1000, 2),
            cost=outcome.cost))
        verdict.cost += outcome.cost
        verdict.reward = outcome.value
        verdict.stopped_because = f"{layer.name} ranked the group's {len(judged)} judged samples"
        verdict.status = _status(outcome.value, spec)
    return verdicts

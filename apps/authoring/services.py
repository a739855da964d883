"""The playgrounds: one task through the real machinery, from a page, without a run.

A verifier is tried on a response typed in (or taken from an archived trajectory) against one task instance; a
task template is shown as the model will see it, and its instance's reference is rolled out and verified as the
reference check does for one task. Both use the sandboxes and the judge a run uses (apps/common/wiring.py), from
the process's shared pool, warm after the first request: a hostile response or reference is contained exactly as in
a rollout, and a judge that is not configured says so.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass

from django.conf import settings

from apps.common import wiring
from apps.registry.models import Version
from apps.registry.pins import pinned_template, task_item
from workers.definitions.specs import VerifierSpec, parse_spec
from workers.rl.config import SandboxConfig
from workers.rl.rollout.reference import check_references, reference_answers
from workers.rl.types import Task, TaskTemplate
from workers.verifiers import Sample, verify

JUDGE_CHECKS = {"score_model", "label_model"}


@dataclass(frozen=True)
class Tried:
    """A verdict from the playground, with what the page says about it."""

    verifier: Version
    verdict: dict  # workers.verifiers.Verdict.to_json()
    artifacts: dict[str, int]  # name -> bytes
    wall_ms: float
    notes: list[str]


def judge_note(verifier_spec: VerifierSpec) -> str | None:
    """Why judge checks of this verifier cannot give a reward here, or None when they can (or there are none)."""
    uses_judge = any(check.type in JUDGE_CHECKS for layer in verifier_spec.layers for check in layer.checks)
    if uses_judge and not settings.JUDGE_BASE_URL:
        return ("The judge is not configured (set JUDGE_BASE_URL to an OpenAI-compatible endpoint): its checks "
                "report infra_error here, as they would in a run, and give no reward.")
    return None


def template_task(template: Version, key: str) -> Task:
    """The engine's Task for one instance of a template version, with the image and verifier it names."""
    pinned = pinned_template(project=template.definition.project,
                             text=f"{template.definition.slug}@{template.number}")
    engine_template = TaskTemplate.from_spec(
        key=template.ref, domain="playground", spec=template.spec, image=pinned.image,
        verifier_key=pinned.verifier_version.ref, verifier_spec=pinned.verifier_version.spec)
    return Task(seq=0, template=engine_template, item=task_item(template=template, key=key))


def response_verify(*, verifiers: list[Version], template: Version, key: str, response: str) -> list[Tried]:
    """`response` to the instance `key` of `template`, verified by each verifier version in the shared pool."""
    task = template_task(template, key)
    context = wiring.verification_context(pool=wiring.shared_sandbox_pool(), image=task.template.image)
    tried = []
    for verifier in verifiers:
        spec = parse_spec("verifier", verifier.spec)
        started = time.monotonic()
        verdict = verify(spec, Sample(response=response), task.item, context)
        tried.append(Tried(verifier=verifier, verdict=verdict.to_json(),
                           artifacts={name: len(blob) for name, blob in verdict.artifacts.items()},
                           wall_ms=(time.monotonic() - started) * 1000,
                           notes=[note for note in [judge_note(spec)] if note]))
    return tried


def reference_try(*, template: Version, key: str) -> dict | None:
    """The instance's reference rolled out (its tool calls run in the sandbox) and verified, as the reference
    check does: the trajectory's turns and verdict, or None when the instance has no reference."""
    task = template_task(template, key)
    answers = reference_answers(task)
    if answers is None:
        return None
    tool_runner, verifier = wiring.local_runners(wiring.shared_sandbox_pool(), SandboxConfig())
    trajectory, = check_references(str(uuid.uuid4()), [(task, answers)], tool_runner=tool_runner,
                                   verifier=verifier, prices=wiring.prices(), concurrency=1)
    return {"turns": [{"role": t.role, "content": t.content} for t in trajectory.turns],
            "status": str(trajectory.status), "status_reason": trajectory.status_reason,
            "verdict": trajectory.verdict.to_json() if trajectory.verdict else None,
            "notes": [note for note in [judge_note(task.template.verifier_spec)] if note]}

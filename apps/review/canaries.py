"""Canaries: confirmed reward hacks kept as tests of a verifier. A trajectory the verifier passed and a reviewer
labelled `reward-hack` (or an adjudicator decided was one) becomes a (task, response) pair that every later
version of that verifier must score 0; `manage.py verify --canaries VERIFIER` and the verifier's review page
check them."""

from __future__ import annotations

from django.db import transaction

from apps.accounts.services import audit_record
from apps.registry.errors import VersionNotFound
from apps.registry.models import Version
from apps.registry.pins import task_item
from apps.registry.refs import parse_ref
from apps.registry.selectors import version_resolve
from workers.definitions.specs import parse_spec
from workers.rl.rollout.grading import tool_logs
from workers.rl.types import Turn
from workers.sandbox import SandboxImage
from workers.verifiers import Item, Sample, verify

from .models import Adjudication, Canary, CanaryResult, Label
from .services import ReviewError

HACK = "reward-hack"


def is_hack(label: Label) -> bool:
    return HACK in label.answers.values() or Adjudication.objects.filter(item=label.item, answer=HACK).exists()


def canary_from_label(*, label: Label, actor, via: str = "web") -> Canary:
    """The canary of a label that says `reward-hack` on a trajectory its verifier passed."""
    trajectory = label.item.trajectory
    if not label.current:
        raise ReviewError(f"label {label.pk} was amended: make the canary from its latest revision", status=409,
                          field="label")
    if not is_hack(label):
        raise ReviewError("only a label (or a gold answer) that says reward-hack makes a canary", field="label")
    if trajectory.verdict_status != "pass":
        raise ReviewError(f"the verifier did not pass this trajectory ({trajectory.verdict_status or 'no verdict'})"
                          ": there is no hack to guard against", field="label")
    project = label.item.queue.project
    try:
        verifier = version_resolve(project=project, ref=parse_ref(trajectory.verifier))
        template = version_resolve(project=project, ref=parse_ref(trajectory.template))
        image = version_resolve(project=project, ref=parse_ref(trajectory.image))
        item = task_item(template=template, key=trajectory.task_key)
    except VersionNotFound as exc:
        raise ReviewError(f"the trajectory's task can no longer be found: {exc}", status=409) from None
    turns = trajectory.turns or []
    response = next((t.get("content", "") for t in reversed(turns) if t.get("role") == "assistant"), "")
    with transaction.atomic():
        canary, created = Canary.objects.get_or_create(
            verifier=verifier.definition, trajectory_id=trajectory.pk,
            defaults={"project": project, "passed_version": verifier, "template": template.ref,
                      "task_key": item.key, "inputs": item.inputs, "hidden": item.hidden,
                      "image": SandboxImage.from_spec(image.ref, image.spec).to_json(), "response": response,
                      "logs": tool_logs(map(Turn.from_json, turns)),
                      "label": label, "created_by": actor if getattr(actor, "is_authenticated", False) else None})
        if created:
            audit_record(project=project, actor=actor, action="review.canary.create",
                         target=f"verifier/{verifier.definition.slug}",
                         details={"trajectory": str(trajectory.pk), "passed": verifier.ref}, via=via)
    return canary


def canary_from_item(*, queue, item_id: int, actor, via: str = "web") -> Canary:
    """The canary of the first current whole-trajectory label on a queue's item that says reward-hack."""
    labels = (Label.objects.whole().current().filter(item__queue=queue, item_id=item_id)
              .select_related("item__trajectory", "item__queue__project").order_by("pk"))
    hack = next((label for label in labels if is_hack(label)), None)
    if hack is None:
        raise ReviewError(f"no label on item {item_id} of queue {queue.slug} says reward-hack", field="item")
    return canary_from_label(label=hack, actor=actor, via=via)


def canaries_check(*, version: Version) -> list[CanaryResult]:
    """Score every canary of the verifier on `version`, in this process's sandboxes (each canary in its own
    image), and keep the results; a canary holds when it scores 0."""
    from apps.common import wiring  # the sandbox pool and verification context are the composition root's

    results, spec = [], parse_spec("verifier", version.spec)
    pool = wiring.sandbox_pool()
    try:
        for canary in Canary.objects.filter(verifier=version.definition).order_by("pk"):
            image = SandboxImage.from_json(canary.image) if canary.image else None
            verdict = verify(spec, Sample(response=canary.response, logs=canary.logs,
                                                  trajectory_id=str(canary.trajectory_id)),
                             Item(key=canary.task_key, inputs=canary.inputs, hidden=canary.hidden),
                             wiring.verification_context(pool=pool, image=image))
            result, _ = CanaryResult.objects.update_or_create(
                canary=canary, version=version,
                defaults={"reward": verdict.reward, "status": verdict.status,
                          "evidence": "; ".join(c.evidence for c in verdict.components if c.evidence)[:2000]})
            results.append(result)
    finally:
        pool.close()
    return results

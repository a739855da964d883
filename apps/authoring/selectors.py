"""Reads for the playground pages: what a verifier is used by and how it has been deciding."""

from collections import Counter

from django.db.models import Q

from apps.registry.models import Definition, Version
from apps.registry.refs import split_slug_ref
from apps.trajectories.models import Trajectory

from .services import JUDGE_CHECKS

RECENT = 1000  # trajectories read for a verifier's pass rate and deciding layers


def templates_using(*, verifier: Definition) -> list[Version]:
    """The newest version of every task template that names this verifier (any version of it): the tasks a
    playground offers first."""
    heads = {}
    for version in (Version.objects.filter(definition__project=verifier.project, definition__kind="task_template")
                    .select_related("definition").order_by("definition__slug", "-number")):
        if version.definition.slug not in heads and split_slug_ref(version.spec["verifier"])[0] == verifier.slug:
            heads[version.definition.slug] = version
    return list(heads.values())


def verifier_usage(*, verifier: Definition) -> dict:
    """Which bundles pin a version of it; over its RECENT newest trajectories, the pass rate, the deciding
    layers and the judge calls made; its canaries (confirmed reward hacks it must keep failing)."""
    prefix = f"verifier/{verifier.slug}@"
    bundles = [f"{version.ref} pins {pinned.ref}" for version in
               Version.objects.filter(definition__project=verifier.project, definition__kind="bundle")
               .select_related("definition").order_by("definition__slug", "number")
               if (pinned := version.lock.get("verifier", verifier.slug)) is not None]
    recent = list(Trajectory.objects.filter(project=verifier.project, verifier__startswith=prefix)
                  .order_by("-finished_at").values("verdict_status", "deciding_layer", "verdict")[:RECENT])
    graded = [row for row in recent if row["verdict_status"] in ("pass", "fail", "partial")]
    judge_calls = sum(1 for row in recent for component in row["verdict"].get("components", [])
                      if component.get("type") in JUDGE_CHECKS)
    return {
        "bundles": bundles,
        "trajectories": len(recent),
        "pass_rate": (sum(row["verdict_status"] == "pass" for row in graded) / len(graded)) if graded else None,
        "deciding": Counter(row["deciding_layer"] or "(none)" for row in recent).most_common(),
        "infra_errors": sum(row["verdict_status"] == "infra_error" for row in recent),
        "judge_calls": judge_calls,
        "canaries": verifier.canaries.count(),
    }


def trajectory_response(*, project, trajectory_id: str) -> tuple[str, str, str] | None:
    """(template ref, task key, final assistant message) of an archived trajectory of the project, or None."""
    row = (Trajectory.objects.filter(Q(project=project), Q(id=trajectory_id))
           .values("template", "task_key", "turns").first())
    if row is None:
        return None
    answers = [turn["content"] for turn in row["turns"] if turn.get("role") == "assistant"]
    return row["template"], row["task_key"], answers[-1] if answers else ""

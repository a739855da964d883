"""What a version pulls in: the exact versions its references resolve to, transitively.

A bundle pins its whole closure on publish (domains -> task templates -> sandbox images and verifiers, and the
members of included bundles), so a run that pins the bundle needs nothing else to be reproducible.
"""

from apps.accounts.models import Project

from .errors import FieldError, SpecError, VersionNotFound
from .models import Version
from .refs import Ref, parse_ref, split_slug_ref
from .selectors import version_resolve


def spec_references(kind: str, spec: dict) -> list[tuple[str, Ref]]:
    """(field path, reference) for every other definition a spec names."""
    if kind == "domain":
        return [(f"templates[{i}].template", Ref("task_template", *split_slug_ref(d["template"])))
                for i, d in enumerate(spec["templates"])]
    if kind == "task_template":
        return [("sandbox_image", Ref("sandbox_image", *split_slug_ref(spec["sandbox_image"]))),
                ("verifier", Ref("verifier", *split_slug_ref(spec["verifier"])))]
    if kind == "bundle":
        return [(f"members[{i}]", parse_ref(m)) for i, m in enumerate(spec["members"])]
    return []


def check_references(*, project: Project, kind: str, spec: dict) -> None:
    errors = []
    for field, ref in spec_references(kind, spec):
        try:
            version_resolve(project=project, ref=ref)
        except VersionNotFound as exc:
            errors.append(FieldError(field, str(exc)))
    if errors:
        raise SpecError(errors)


def resolve_bundle(*, project: Project, slug: str, spec: dict) -> dict:
    """The bundle spec as stored: members pinned to numbers, and `resolved` = the closure with content hashes.

    Raises SpecError for a member that names nothing, a bundle that includes itself (a cycle), or a closure
    that needs two versions of one definition.
    """
    check_references(project=project, kind="bundle", spec=spec)
    pinned: dict[tuple[str, str], Version] = {}
    errors: list[FieldError] = []
    members = []
    for field, ref in spec_references("bundle", spec):
        version = version_resolve(project=project, ref=ref)
        members.append(version.ref)
        for path, member in _closure(project=project, version=version, path=(version.ref,)):
            key = (member.definition.kind, member.definition.slug)
            if key == ("bundle", slug):
                errors.append(FieldError(field, f"bundle cycle: {slug} -> {' -> '.join(path)}"))
                continue
            if key in pinned and pinned[key].number != member.number:
                errors.append(FieldError(field, f"{key[0]}/{key[1]} is needed at @{pinned[key].number} and "
                                                f"@{member.number}; pin one version in the members"))
                continue
            pinned[key] = member
    if errors:
        raise SpecError(errors)
    resolved = [{"ref": v.ref, "content_hash": v.content_hash}
                for _, v in sorted(pinned.items())]
    return {**spec, "members": members, "resolved": resolved}


def _closure(*, project: Project, version: Version, path: tuple[str, ...]):
    """Yields (path, version) for the version and everything it references, depth first."""
    yield path, version
    if version.definition.kind == "bundle":
        for member in version.spec["resolved"]:
            yield path + (member["ref"],), version_resolve(project=project, ref=parse_ref(member["ref"]))
        return
    for _, ref in spec_references(version.definition.kind, version.spec):
        child = version_resolve(project=project, ref=ref)
        yield from _closure(project=project, version=child, path=path + (child.ref,))

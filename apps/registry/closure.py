"""What a version pulls in: the exact versions its references resolve to, transitively.

A bundle pins its whole closure on publish (domains -> task templates -> sandbox images and verifiers, and the
members of included bundles), so a run that pins the bundle needs nothing else to be reproducible.

`members` work like requirements and `resolved` like a lock file: a floating reference (`slug`, `@latest`) that
the lock already pins keeps its pinned version, so re-publishing or importing a bundle never drifts to newer
versions by itself. Delete an entry from `resolved` to move it to the newest version.
"""

from django.db.models import F, Max

from apps.accounts.models import Project

from .errors import FieldError, ReferenceNotFound, SpecError, VersionNotFound
from .lock import BundleLock, PinnedVersion
from .models import Version
from .refs import Ref, parse_ref, split_slug_ref
from .selectors import version_resolve, versions_resolve


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


class _Versions:
    """version_resolve with a memory, filled in bulk: a bundle's closure is looked up a level at a time (its
    members, then what they name, ...), in a few queries per level rather than a few per definition. A reference
    the bulk lookup did not find goes to version_resolve itself, which raises what is wrong with it."""

    def __init__(self, project: Project):
        self.project = project
        self.known: dict[Ref, Version] = {}

    def load(self, refs) -> list[Version]:
        """Look up every reference not known yet; returns the versions the references name (the ones found)."""
        refs = list(refs)
        self.known.update(versions_resolve(project=self.project, refs=[r for r in refs if r not in self.known]))
        return [self.known[ref] for ref in refs if ref in self.known]

    def get(self, ref: Ref) -> Version:
        version = self.known.get(ref)
        return version if version is not None else version_resolve(project=self.project, ref=ref)


def check_references(*, project: Project, kind: str, spec: dict, versions: _Versions | None = None) -> None:
    versions = versions or _Versions(project)
    references = spec_references(kind, spec)
    versions.load(ref for _, ref in references)
    errors = []
    for field, ref in references:
        try:
            versions.get(ref)
        except VersionNotFound as exc:
            errors.append(FieldError(field, str(exc)))
    if errors:
        raise ReferenceNotFound(errors)


def resolve_bundle(*, project: Project, slug: str, spec: dict) -> dict:
    """The bundle spec as stored: members pinned to numbers, and `resolved` = the closure with content hashes.

    Raises SpecError for a member that names nothing, a bundle that includes itself (a cycle), or a closure
    that needs two versions of one definition.
    """
    versions = _Versions(project)
    check_references(project=project, kind="bundle", spec=spec, versions=versions)
    lock, errors = _lock(resolved=spec.get("resolved", []), versions=versions)
    _load_closure(versions, [lock.pin(ref) for _, ref in spec_references("bundle", spec)], lock=lock)
    pinned: dict[tuple[str, str], Version] = {}
    members = []
    for field, ref in spec_references("bundle", spec):
        version = versions.get(lock.pin(ref))
        members.append(version.ref)
        for path, member in _closure(versions, version=version, path=(version.ref,), lock=lock):
            key = (member.definition.kind, member.definition.slug)
            if key == ("bundle", slug):
                errors.append(FieldError(field, f"bundle cycle: {slug} -> {' -> '.join(path)}"))
                continue
            if key in pinned and pinned[key].number != member.number:
                errors.append(FieldError(field, f"{key[0]}/{key[1]} is needed at @{pinned[key].number} and "
                                                f"@{member.number}; pin one version in the members"))
                continue
            pinned[key] = member
    run_config = dict(spec.get("run_config", {}))
    try:  # the base model its run settings name is pinned with the rest
        model = run_model_ref(run_config)
        version = None if model is None else versions.get(lock.pin(model))
    except VersionNotFound as exc:
        errors.append(FieldError("run_config.model", str(exc)))
        version = None
    if version is not None:
        key = (version.definition.kind, version.definition.slug)
        if key in pinned and pinned[key].number != version.number:
            errors.append(FieldError("run_config.model", f"{version.ref} is asked for, but a member pins "
                                                         f"@{pinned[key].number}"))
        pinned[key] = version
        run_config["model"] = version.ref
    if errors:
        raise SpecError(errors)
    resolved = [{"ref": v.ref, "content_hash": v.content_hash}
                for _, v in sorted(pinned.items())]
    pinned_spec = {**spec, "members": members, "resolved": resolved}
    if run_config:
        pinned_spec["run_config"] = run_config
    return pinned_spec


def run_model_ref(run_config: dict) -> Ref | None:
    """The model definition run settings name (`model`: model/SLUG[@N|@alias]), or None for a built-in name or
    a path."""
    model = run_config.get("model")
    if not isinstance(model, str) or not model.startswith("model/"):
        return None
    return parse_ref(model)


def _lock(*, resolved: list[dict], versions: _Versions) -> tuple[BundleLock, list[FieldError]]:
    """The lock a draft carries (as written, perhaps by hand), each entry checked against this registry."""
    pinned, errors = [], []
    refs = [parse_ref(entry["ref"]) for entry in resolved]
    versions.load(refs)
    for index, (entry, ref) in enumerate(zip(resolved, refs, strict=True)):
        try:
            version = versions.get(ref)
        except VersionNotFound as exc:
            errors.append(FieldError(f"resolved[{index}].ref", str(exc)))
            continue
        if version.content_hash != entry["content_hash"]:
            errors.append(FieldError(f"resolved[{index}].content_hash",
                                     f"{version.ref} hashes to {version.content_hash[:12]} in this registry, not "
                                     f"{entry['content_hash'][:12]}; remove the entry to pin the newest version"))
        pinned.append(PinnedVersion(Ref(ref.kind, ref.slug, str(version.number)), entry["content_hash"]))
    return BundleLock(tuple(pinned)), errors


def _children(version: Version, lock: BundleLock) -> list[Ref]:
    """What _closure looks up below a version: an included bundle's lock, or the references of its spec."""
    if version.definition.kind == "bundle":
        return [pinned.ref for pinned in version.lock.pinned]
    return [lock.pin(ref) for _, ref in spec_references(version.definition.kind, version.spec)]


def _load_closure(versions: _Versions, refs: list[Ref], *, lock: BundleLock) -> None:
    """Look up everything _closure will walk below `refs`, a level at a time."""
    seen: set[int] = set()
    level = versions.load(refs)
    while level:
        walked, pinned_by_bundles = [], []  # an included bundle's lock is its closure already: not walked further
        for version in level:
            if version.pk not in seen:
                seen.add(version.pk)
                (pinned_by_bundles if version.definition.kind == "bundle" else walked).extend(
                    _children(version, lock))
        versions.load(pinned_by_bundles)
        level = versions.load(walked)


def _closure(versions: _Versions, *, version: Version, path: tuple[str, ...], lock: BundleLock):
    """Yields (path, version) for the version and everything it references, depth first."""
    yield path, version
    if version.definition.kind == "bundle":
        for pinned in version.lock.pinned:
            yield path + (str(pinned.ref),), versions.get(pinned.ref)
        return
    for ref in _children(version, lock):
        child = versions.get(ref)
        yield from _closure(versions, version=child, path=path + (child.ref,), lock=lock)


def dependents(*, project: Project, kind: str, slug: str) -> dict[str, list[str]]:
    """What else publishing a new version of kind/slug changes, read from the newest version of every definition
    in the project: `floating` names the ones that refer to it without a number (slug, @latest, an alias) and
    so take the new version from then on (the next bundle that resolves them, the next run on such a bundle);
    `pinned` names the bundles whose lock pins a version of it, which keep that version until re-resolved."""
    floating, pinned = [], []
    heads = (Version.objects.filter(definition__project=project)
             .annotate(head=Max("definition__versions__number")).filter(number=F("head"))
             .select_related("definition").order_by("definition__kind", "definition__slug"))
    for version in heads:
        spec = version.spec
        for field, ref in spec_references(version.definition.kind, spec):
            if (ref.kind, ref.slug) == (kind, slug) and ref.number is None:
                floating.append(f"{version.ref} ({field}: {ref.selector or 'latest'})")
        locked = version.lock.get(kind, slug)
        if locked is not None:
            pinned.append(f"{version.ref} (pins {locked.ref})")
    return {"floating": floating, "pinned": pinned}

"""Reads for the registry. Every selector takes the project, so nothing leaks across projects."""

from collections import defaultdict
from collections.abc import Iterable

from django.db.models import Count, Max, QuerySet

from apps.accounts.models import Project

from .errors import VersionNotFound
from .models import Alias, Definition, InstanceSetMember, Version
from .refs import LATEST, Ref


def definition_list(*, project: Project, kind: str | None = None) -> QuerySet[Definition]:
    qs = Definition.objects.filter(project=project).annotate(
        version_count=Count("versions"), head_number=Max("versions__number")
    )
    return qs.filter(kind=kind) if kind else qs


def definition_get(*, project: Project, kind: str, slug: str) -> Definition:
    definition = Definition.objects.filter(project=project, kind=kind, slug=slug).first()
    if definition is None:
        raise VersionNotFound(f"No {kind} named {slug!r} in project {project.slug!r}.")
    return definition


def version_head(*, definition: Definition) -> Version | None:
    return Version.objects.filter(definition=definition).order_by("-number").first()


def version_list(*, definition: Definition) -> QuerySet[Version]:
    return Version.objects.filter(definition=definition).select_related("author", "parent").order_by("-number")


def version_resolve(*, project: Project, ref: Ref) -> Version:
    """The exact version a reference names. `@latest` (or no selector) is the newest version."""
    definition = definition_get(project=project, kind=ref.kind, slug=ref.slug)
    versions = Version.objects.filter(definition=definition).select_related("definition")
    if ref.selector in (None, LATEST):
        version = versions.order_by("-number").first()
    elif ref.number is not None:
        version = versions.filter(number=ref.number).first()
    else:
        alias = Alias.objects.filter(definition=definition, name=ref.selector).select_related("version").first()
        version = alias.version if alias else None
        if alias is None:
            names = ", ".join(Alias.objects.filter(definition=definition).values_list("name", flat=True)) or "none"
            raise VersionNotFound(f"{ref.kind}/{ref.slug} has no alias {ref.selector!r} (aliases: {names}).")
    if version is None:
        head = versions.order_by("-number").first()
        raise VersionNotFound(
            f"{ref} does not exist; {ref.kind}/{ref.slug} has versions 1..{head.number}." if head
            else f"{ref.kind}/{ref.slug} has no versions yet."
        )
    return version


def versions_resolve(*, project: Project, refs: Iterable[Ref]) -> dict[Ref, Version]:
    """version_resolve for many references at once, in two queries however many there are (three when some
    name aliases; a bundle of a thousand domains names thousands): each reference that names an existing version,
    with it. The others are left out; version_resolve says what is wrong with each."""
    refs = set(refs)
    if not refs:
        return {}
    pairs = {(ref.kind, ref.slug) for ref in refs}
    definitions: dict[tuple[str, str], int] = {}
    numbers: dict[int, dict[int, int]] = defaultdict(dict)  # definition -> number -> version
    for definition_id, kind, slug, number, pk in Version.objects.filter(
            definition__project=project, definition__kind__in={kind for kind, _ in pairs},
            definition__slug__in={slug for _, slug in pairs},
    ).values_list("definition_id", "definition__kind", "definition__slug", "number", "pk"):
        if (kind, slug) in pairs:
            definitions[(kind, slug)] = definition_id
            numbers[definition_id][number] = pk
    aliased = {definitions[(r.kind, r.slug)] for r in refs if r.selector not in (None, LATEST) and r.number is None
               and (r.kind, r.slug) in definitions}
    aliases = {(definition_id, name): pk for definition_id, name, pk in Alias.objects.filter(
        definition_id__in=aliased).values_list("definition_id", "name", "version_id")} if aliased else {}
    chosen = {}
    for ref in refs:
        definition_id = definitions.get((ref.kind, ref.slug))
        versions = numbers.get(definition_id)
        if not versions:
            continue
        if ref.selector in (None, LATEST):
            pk = versions[max(versions)]
        elif ref.number is not None:
            pk = versions.get(ref.number)
        else:
            pk = aliases.get((definition_id, ref.selector))
        if pk is not None:
            chosen[ref] = pk
    rows = Version.objects.filter(pk__in=set(chosen.values())).select_related("definition").in_bulk() if chosen else {}
    return {ref: rows[pk] for ref, pk in chosen.items()}


def alias_list(*, definition: Definition) -> QuerySet[Alias]:
    return Alias.objects.filter(definition=definition).select_related("version")


def instance_page(*, version: Version, after_key: str = "", limit: int = 100) -> list[InstanceSetMember]:
    """Keyset pagination by key: page N costs the same as page 1, at any number of instances."""
    if version.instance_set_id is None:
        return []
    qs = InstanceSetMember.objects.filter(instance_set_id=version.instance_set_id)
    if after_key:
        qs = qs.filter(key__gt=after_key)
    return list(qs.select_related("instance").order_by("key")[:limit])


def instance_hashes(*, version: Version) -> dict[str, str]:
    """Each task instance's content hash by key, for comparing a version's tasks with others (a task upload's)."""
    if version.instance_set_id is None:
        return {}
    return dict(InstanceSetMember.objects.filter(instance_set_id=version.instance_set_id)
                .values_list("key", "instance__content_hash"))


def instance_rows(*, version: Version, chunk: int = 2000):
    """(key, inputs, hidden) of every instance of a version in key order, a chunk at a time, without building
    model objects (export and the workers read tens of thousands)."""
    if version.instance_set_id is None:
        return
    after = ""
    while True:
        page = list(InstanceSetMember.objects.filter(instance_set_id=version.instance_set_id, key__gt=after)
                    .order_by("key").values_list("key", "instance__inputs", "instance__hidden")[:chunk])
        if not page:
            return
        yield from page
        after = page[-1][0]

"""From pinned registry versions to the engine's plain objects: what a run, a reference check or a one-off
verification needs to know about its tasks.

The registry's "fetch" of what a bundle pins. Everything is looked up through exact versions — a bundle's lock
(`Version.lock`, lock.py: exact versions with content hashes), never `latest` — so a run started last week
samples the same tasks today, whatever was published since.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from apps.accounts.models import Project
from apps.common.errors import StudioError
from apps.registry.errors import VersionNotFound
from apps.registry.models import InstanceSetMember, Version
from apps.registry.refs import Ref, split_slug_ref
from apps.registry.selectors import version_resolve
from workers.definitions.specs import VerifierSpec, parse_spec
from workers.rl.config import GRPOConfig
from workers.rl.rollout.swe_tools import SWE_TOOL_NAMES, offers_swe_tools
from workers.rl.rollout.tools import BUILTIN_TOOLS, unknown_tools
from workers.rl.tasks.scheduler import DomainMix, TemplateMix
from workers.rl.tasks.taskset import TaskSet
from workers.rl.types import TaskTemplate
from workers.sandbox import SandboxImage
from workers.verifiers import Item


class PinnedBundleError(StudioError, ValueError):
    """The bundle cannot be trained on as it stands (in words the run's page shows)."""


def bundle_tasks(*, bundle: Version, config: GRPOConfig | None = None) -> TaskSet:
    """The tasks of a bundle version, with the domain mix a GRPO run's config asks for (without one: the domains'
    own weights, as every other kind of run reads them)."""
    project, lock = bundle.definition.project, bundle.lock
    kinds = ("domain", "task_template", "sandbox_image", "verifier")
    versions = {(v.definition.kind, v.definition.slug): v for v in Version.objects.filter(
        definition__project=project, definition__kind__in=kinds,
        definition__slug__in=[p.ref.slug for p in lock.of_kind(*kinds)]).select_related("definition")
        if lock.number(v.definition.kind, v.definition.slug) == v.number}

    def pinned(kind: str, text: str) -> Version:
        slug, _ = split_slug_ref(text)
        version = versions.get((kind, slug))
        if version is None:
            raise PinnedBundleError(f"{bundle.ref} does not pin {kind}/{slug}")
        return version

    members = _instances_of([versions[("task_template", split_slug_ref(draw["template"])[0])].instance_set_id
                             for (kind, _), domain_version in versions.items() if kind == "domain"
                             for draw in domain_version.spec["templates"]
                             if ("task_template", split_slug_ref(draw["template"])[0]) in versions])
    images: dict[str, SandboxImage] = {}  # one image serves many templates: built once

    weights, quotas = (config.domain_weights, config.domain_quotas) if config is not None else ({}, {})
    category_weights = config.category_weights if config is not None else {}
    templates, items, hashes, domains = {}, {}, {}, []
    for (kind, slug), domain_version in sorted(versions.items()):
        if kind != "domain":
            continue
        mixes = []
        for draw in domain_version.spec["templates"]:
            template_version = pinned("task_template", draw["template"])
            image_version = pinned("sandbox_image", template_version.spec["sandbox_image"])
            verifier_version = pinned("verifier", template_version.spec["verifier"])
            key = template_version.ref
            if key not in templates:
                if image_version.ref not in images:
                    images[image_version.ref] = SandboxImage.from_spec(image_version.ref, image_version.spec)
                template = TaskTemplate.from_spec(
                    key=key, domain=slug, spec=template_version.spec, image=images[image_version.ref],
                    verifier_key=verifier_version.ref, verifier_spec=verifier_version.spec)
                unknown = [] if template.session and offers_swe_tools(template.tools) else \
                    unknown_tools(template.tools)
                if unknown:
                    raise PinnedBundleError(f"{key} offers tools the engine does not implement: {', '.join(unknown)} "
                                            f"(built in: {', '.join(BUILTIN_TOOLS)}; with a session: "
                                            f"{', '.join(SWE_TOOL_NAMES)})")
                templates[key] = template
                rows = members.get(template_version.instance_set_id, [])
                items[key] = {task_key: Item(key=task_key, inputs=inputs, hidden=hidden)
                              for task_key, inputs, hidden, _ in rows}
                hashes[key] = {task_key: content_hash for task_key, _, _, content_hash in rows}
            if not items[key]:
                raise PinnedBundleError(f"{key} has no task instances")
            mixes.append(TemplateMix(key=key, weight=draw["weight"], task_keys=tuple(items[key])))
        category = domain_version.spec.get("category", "")
        weight = weights.get(slug, domain_version.spec["sampling_weight"]) * category_weights.get(category, 1.0)
        domains.append(DomainMix(name=slug, weight=weight, templates=tuple(mixes), quota=quotas.get(slug),
                                 category=category))
    unknown_domains = sorted((set(weights) | set(quotas)) - {d.name for d in domains})
    if unknown_domains:
        raise PinnedBundleError(f"the config names domains the bundle does not have: {_listed(unknown_domains)} "
                                f"(it has {_listed([d.name for d in domains])})")
    category_quotas = config.category_quotas if config is not None else {}
    unknown_categories = sorted((set(category_weights) | set(category_quotas)) - {d.category for d in domains})
    if unknown_categories:
        raise PinnedBundleError(f"the config names categories no domain of the bundle has: "
                                f"{_listed(unknown_categories)} (it has "
                                f"{_listed(sorted({d.category for d in domains if d.category})) or 'none'})")
    if not domains:
        raise PinnedBundleError(f"{bundle.ref} pins no domain: a run samples tasks from domains")
    return TaskSet(templates=templates, domains=domains, items=items, item_hashes=hashes)


def _listed(names: list[str], most: int = 20) -> str:
    """Names for a message, the first `most` of them: a bundle of a thousand domains would fill a page."""
    shown = ", ".join(names[:most])
    return shown if len(names) <= most else f"{shown} and {len(names) - most} more"


def _instances_of(instance_sets: list[int | None]) -> dict[int, list[tuple]]:
    """The task instances of every instance set, (key, inputs, hidden, content hash) in key order: one query for a
    bundle's thousand templates rather than one each."""
    members: dict[int, list[tuple]] = {}
    rows = (InstanceSetMember.objects.filter(instance_set_id__in={s for s in instance_sets if s is not None})
            .order_by("instance_set_id", "key")
            .values_list("instance_set_id", "key", "instance__inputs", "instance__hidden", "instance__content_hash"))
    for instance_set_id, *row in rows.iterator(chunk_size=5000):
        members.setdefault(instance_set_id, []).append(tuple(row))
    return members


@dataclass(frozen=True)
class PinnedTemplate:
    """A task template version with the image and verifier versions it names, resolved."""

    template: Version
    image_version: Version
    verifier_version: Version

    @property
    def image(self) -> SandboxImage:
        return SandboxImage.from_spec(self.image_version.ref, self.image_version.spec)

    @cached_property
    def verifier_spec(self) -> VerifierSpec:
        """The verifier version's spec, parsed once (checks take the typed spec)."""
        return parse_spec("verifier", self.verifier_version.spec)


def pinned_template(*, project: Project, text: str) -> PinnedTemplate:
    """`slug`, `slug@N` or `slug@alias` of a task template, with its image and verifier resolved."""
    template = version_resolve(project=project, ref=Ref("task_template", *split_slug_ref(text)))
    image = version_resolve(project=project, ref=Ref("sandbox_image", *split_slug_ref(template.spec["sandbox_image"])))
    verifier = version_resolve(project=project, ref=Ref("verifier", *split_slug_ref(template.spec["verifier"])))
    return PinnedTemplate(template=template, image_version=image, verifier_version=verifier)


def task_item(*, template: Version, key: str) -> Item:
    member = (InstanceSetMember.objects.filter(instance_set_id=template.instance_set_id, key=key)
              .select_related("instance").first())
    if member is None:
        raise VersionNotFound(f"{template.ref} has no task instance {key!r}")
    return Item(key=key, inputs=member.instance.inputs, hidden=member.instance.hidden)

"""From a run's pinned bundle to the engine's plain objects: task templates, their instances, the domain mix.

Everything is looked up through the bundle's `resolved` lock (exact versions with content hashes), never
through `latest`: a run started last week samples the same tasks today, whatever was published since.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from apps.registry.models import InstanceSetMember, Version
from apps.registry.refs import parse_ref, split_slug_ref
from workers.rl.config import RunConfig
from workers.rl.scheduler import DomainMix, TemplateMix
from workers.rl.tools import unknown_tools
from workers.rl.types import TaskTemplate
from workers.sandbox import SandboxImage
from workers.verifiers import Item


class PinnedBundleError(ValueError):
    """The bundle cannot be trained on as it stands (in words the run's page shows)."""


@dataclass
class PinnedBundle:
    templates: dict[str, TaskTemplate]
    domains: list[DomainMix]
    items: dict[str, dict[str, Item]]  # template key -> task key -> item
    item_hashes: dict[str, dict[str, str]]

    def item(self, template_key: str, task_key: str) -> Item:
        return self.items[template_key][task_key]

    def item_hash(self, template_key: str, task_key: str) -> str:
        return self.item_hashes[template_key][task_key]

    def eval_tasks(self, *, per_domain: int, seed: int) -> list[tuple[str, str]]:
        """A fixed sample of tasks per domain (by template weight), the same at the start and the end."""
        rng = random.Random(f"eval-{seed}")
        chosen = []
        for domain in self.domains:
            for _ in range(per_domain):
                template = rng.choices(domain.templates, weights=[t.weight for t in domain.templates])[0]
                chosen.append((template.key, rng.choice(template.task_keys)))
        return chosen


def pinned_bundle(*, bundle: Version, config: RunConfig) -> PinnedBundle:
    project = bundle.definition.project
    refs = [parse_ref(entry["ref"]) for entry in bundle.spec["resolved"]]
    numbers = {(ref.kind, ref.slug): ref.number for ref in refs}
    versions = {(v.definition.kind, v.definition.slug): v for v in Version.objects.filter(
        definition__project=project, definition__kind__in=["domain", "task_template", "sandbox_image", "verifier"],
        definition__slug__in=[ref.slug for ref in refs]).select_related("definition")
        if numbers.get((v.definition.kind, v.definition.slug)) == v.number}

    def pinned(kind: str, text: str) -> Version:
        slug, _ = split_slug_ref(text)
        version = versions.get((kind, slug))
        if version is None:
            raise PinnedBundleError(f"{bundle.ref} does not pin {kind}/{slug}")
        return version

    templates, items, hashes, domains = {}, {}, {}, []
    for (kind, slug), domain_version in sorted(versions.items()):
        if kind != "domain":
            continue
        mixes = []
        for draw in domain_version.spec["templates"]:
            template_version = pinned("task_template", draw["template"])
            image_version = pinned("sandbox_image", template_version.spec["sandbox_image"])
            verifier_version = pinned("verifier", template_version.spec["verifier"])
            unknown = unknown_tools(template_version.spec.get("tools", []))
            if unknown:
                raise PinnedBundleError(f"{template_version.ref} offers tools the engine does not implement: "
                                        f"{', '.join(unknown)} (built in: run_python, read_document, search_documents)")
            key = template_version.ref
            if key not in templates:
                templates[key] = TaskTemplate.from_spec(
                    key=key, domain=slug, spec=template_version.spec,
                    image=SandboxImage.from_spec(image_version.ref, image_version.spec),
                    verifier_key=verifier_version.ref, verifier_spec=verifier_version.spec)
                members = (InstanceSetMember.objects.filter(instance_set_id=template_version.instance_set_id)
                           .select_related("instance").order_by("key"))
                items[key] = {m.key: Item(key=m.key, inputs=m.instance.inputs, hidden=m.instance.hidden) for m in members}
                hashes[key] = {m.key: m.instance.content_hash for m in members}
            if not items[key]:
                raise PinnedBundleError(f"{key} has no task instances")
            mixes.append(TemplateMix(key=key, weight=draw["weight"], task_keys=tuple(items[key])))
        weight = config.domain_weights.get(slug, domain_version.spec["sampling_weight"])
        domains.append(DomainMix(name=slug, weight=weight, templates=tuple(mixes),
                                 quota=config.domain_quotas.get(slug)))
    unknown_domains = sorted((set(config.domain_weights) | set(config.domain_quotas)) - {d.name for d in domains})
    if unknown_domains:
        raise PinnedBundleError(f"the config names domains the bundle does not have: {', '.join(unknown_domains)} "
                                f"(it has {', '.join(d.name for d in domains)})")
    if not domains:
        raise PinnedBundleError(f"{bundle.ref} pins no domain: a run samples tasks from domains")
    return PinnedBundle(templates=templates, domains=domains, items=items, item_hashes=hashes)

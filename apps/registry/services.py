"""Writes for the registry. Each is one transaction with an audit row; callers check the actor's role."""

import re
from dataclasses import dataclass

from django.conf import settings
from django.db import transaction

from apps.accounts.models import Project
from apps.accounts.services import audit_record
from workers.definitions.canonical import (
    canonical_json,
    data_problem,
    instance_hash,
    instance_set_digest,
    version_content_hash,
)
from workers.definitions.specs import (
    ALIAS_RE,
    MAX_SPEC_BYTES,
    SLUG_RE,
    SPEC_SCHEMA_VERSION,
    prompt_placeholders,
    validate_spec,
)
from workers.rl.config import SET_BY_THE_STUDIO, ConfigError, check_recommended
from workers.rl.models.packaged import ModelUnavailable
from workers.rl.models.weights import WeightsMismatch, source_model, weights_sha256
from workers.rl.tasks.generators import GeneratorError, materialise

from .bulk import bulk_insert, json_text
from .closure import check_references, resolve_bundle
from .dataset_store import dataset_spec_check
from .errors import FieldError, PublishConflict, SpecError
from .models import Alias, Definition, InstanceSet, InstanceSetMember, TaskInstance, Version
from .refs import LATEST

INSTANCE_KEY_MAX = 200


@dataclass(frozen=True)
class Published:
    version: Version
    created: bool  # False when the spec was identical to the newest version, which is returned instead


def _model_weights_pinned(spec: dict) -> dict:
    """A model definition whose source a run may use, with the hash of its weights filled in (or checked, when
    the author gave one) where this host can read them."""
    from apps.common import wiring  # which directories models may be read from is the composition root's setting

    model = source_model(spec["source"])
    problem = wiring.model_problem(model)
    if problem:
        raise SpecError([FieldError("source", problem)])
    try:
        found = weights_sha256(model)
    except (OSError, ModelUnavailable, WeightsMismatch) as exc:
        raise SpecError([FieldError("source", f"cannot read the weights of {model}: {exc}")]) from None
    if not found and spec["weights_sha256"]:
        raise SpecError([FieldError("weights_sha256", "the demo model's weights are made from a run's own tasks "
                                                      "(the bundle pins them); leave this empty")])
    if spec["weights_sha256"] and spec["weights_sha256"] != found:
        raise SpecError([FieldError("weights_sha256", f"the weights of {model} hash to {found}, not "
                                                      f"{spec['weights_sha256']}")])
    return {**spec, "weights_sha256": found}


def spec_check(*, project: Project, kind: str, slug: str, spec: dict) -> dict:
    """The spec as it would be stored as the next version of kind/slug, or SpecError naming every problem found.

    Everything a publish checks before it writes: the editor's inline validation and the API's validate call
    use this, so they report exactly the errors a publish would.
    """
    if not re.fullmatch(SLUG_RE, slug or ""):
        raise SpecError([FieldError("slug", f"{slug!r}: use 1-63 lowercase letters, digits and hyphens, starting "
                                            "with a letter or digit (no '/', '.', spaces)")])
    normalised = validate_spec(kind, spec)
    size = len(canonical_json(normalised).encode())
    if size > MAX_SPEC_BYTES:
        raise SpecError([FieldError("spec", f"is {size / 1e6:.1f} MB; the limit is {MAX_SPEC_BYTES / 1e6:.0f} MB "
                                            "(put task data in task instances, not in the spec)")])
    if kind == "sandbox_image" and normalised["limits"]["network"] and not settings.SANDBOX_NETWORK:
        raise SpecError([FieldError("limits.network", "sandboxes in this studio have no network: with it, "
                                    "model-written code would reach the host's own services (its database, Redis, "
                                    "the cloud's metadata address). Remove it (network: false); if the tasks "
                                    "really need it, the operator can allow it with STUDIO_SANDBOX_NETWORK=1")])
    if kind == "bundle":
        studio_set = sorted(set(normalised.get("run_config", {})) & set(SET_BY_THE_STUDIO))
        if studio_set:
            raise SpecError([FieldError(f"run_config.{name}", "set by the studio when a run is created, from the "
                                                              "model definition; name the model instead")
                             for name in studio_set])
        try:
            check_recommended(normalised.get("run_config"))
        except ConfigError as exc:
            raise SpecError([FieldError("run_config", str(exc))]) from None
        normalised = resolve_bundle(project=project, slug=slug, spec=normalised)
    elif kind == "model":
        normalised = _model_weights_pinned(normalised)
    elif kind == "dataset":
        dataset_spec_check(normalised)
    else:
        check_references(project=project, kind=kind, spec=normalised)
    return normalised


def version_publish(
    *,
    project: Project,
    kind: str,
    slug: str,
    spec: dict,
    author,
    message: str = "",
    description: str | None = None,
    instances: list[dict] | None = None,
    expected_head: int | None = None,
    via: str = "web",
) -> Published:
    """Publish `spec` as the next version of kind/slug, creating the definition on its first version.

    instances: for task templates, the full list of {key, inputs, hidden}; None keeps the previous version's. A
    template with a `generator` takes none: its instances are materialised from it (workers/rl/tasks/generators.py),
    or kept from the previous version when that one has the same generator.
    expected_head: the version number an edit started from; if another version was published since, the
    publish is refused with PublishConflict rather than silently overwriting that work.
    """
    normalised = spec_check(project=project, kind=kind, slug=slug, spec=spec)
    if instances is not None and kind != "task_template":
        raise SpecError([FieldError("instances", f"only task templates have task instances, not a {kind}")])
    generated = _generated_instances(project=project, slug=slug, spec=normalised, instances=instances)

    with transaction.atomic():
        definition = _definition_for_publish(project=project, kind=kind, slug=slug, description=description,
                                             actor=author, via=via)
        head = Version.objects.filter(definition=definition).order_by("-number").first()
        if expected_head is not None and (head.number if head else 0) != expected_head:
            raise PublishConflict(
                f"{kind}/{slug} is at @{head.number if head else 0} now, but your edit started from @{expected_head}. "
                "Open the newest version, compare, and publish again."
            )
        instance_set = None
        if kind == "task_template":
            if normalised.get("generator"):
                if head is not None and head.spec.get("generator") == normalised["generator"]:
                    instance_set = head.instance_set
                else:
                    generated = generated if generated is not None else _materialised(normalised)
                    _instances_check(normalised, generated)
                    instance_set = _instance_set_store(definition=definition, instances=generated)
            elif instances is None:
                instance_set = head.instance_set if head else _instance_set_store(definition=definition, instances=[])
            else:
                _instances_check(normalised, instances)
                instance_set = _instance_set_store(definition=definition, instances=instances)
        content = version_content_hash(normalised, instance_set.digest if instance_set else None)
        if head is not None and head.content_hash == content:
            return Published(head, created=False)
        version = Version.objects.create(
            definition=definition,
            number=(head.number + 1) if head else 1,
            spec=normalised,
            schema_version=SPEC_SCHEMA_VERSION,
            content_hash=content,
            instance_set=instance_set,
            parent=head,
            message=message,
            author=author if getattr(author, "is_authenticated", False) else None,
        )
        audit_record(project=project, actor=author, action="version.publish", target=version.ref, via=via,
                     details={"content_hash": content, "parent": head.number if head else None, "message": message})
        return Published(version, created=True)


def _generated_instances(*, project, slug: str, spec: dict, instances) -> list[dict] | None:
    """A generated template's instances, materialised before the publish's transaction (it takes seconds, and
    holds no lock meanwhile); None when the newest version has the same generator, whose instances are kept."""
    if not spec.get("generator"):
        return None
    if instances is not None:
        raise SpecError([FieldError("instances", "a generated template's instances come from its generator; "
                                                 "leave them out")])
    head = (Version.objects.filter(definition__project=project, definition__kind="task_template",
                                   definition__slug=slug).order_by("-number").only("spec").first())
    if head is not None and head.spec.get("generator") == spec["generator"]:
        return None
    return _materialised(spec)


def _materialised(spec: dict) -> list[dict]:
    try:
        return materialise(spec["generator"])
    except GeneratorError as exc:
        raise SpecError([FieldError("generator", str(exc))]) from None


def _definition_for_publish(*, project, kind, slug, description, actor, via) -> Definition:
    definition, created = Definition.objects.get_or_create(
        project=project, kind=kind, slug=slug, defaults={"description": description or ""}
    )
    if created:
        audit_record(project=project, actor=actor, action="definition.create", target=str(definition), via=via)
    elif description is not None and description != definition.description:
        Definition.objects.filter(pk=definition.pk).update(description=description)
        audit_record(project=project, actor=actor, action="definition.describe", target=str(definition), via=via,
                     details={"description": description})
    # Serialises publishes of one definition: the next number is read and written under this row lock.
    return Definition.objects.select_for_update().get(pk=definition.pk)


def _instances_check(spec: dict, instances: list[dict]) -> None:
    needed = prompt_placeholders(spec["prompt_template"])
    errors, seen = [], set()
    for i, item in enumerate(instances):
        where = f"instances[{i}]"
        if not isinstance(item, dict):
            errors.append(FieldError(where, "must be a mapping with key, inputs and hidden"))
            continue
        unknown = sorted(set(item) - {"key", "inputs", "hidden"})
        if unknown:
            errors.append(FieldError(where, f"unknown field(s) {', '.join(unknown)}; allowed: key, inputs, hidden"))
        key, inputs, hidden = item.get("key"), item.get("inputs"), item.get("hidden", {})
        if not isinstance(key, str) or not key or len(key) > INSTANCE_KEY_MAX or key != key.strip():
            errors.append(FieldError(f"{where}.key", f"must be a non-empty string of at most {INSTANCE_KEY_MAX} "
                                                     "characters without surrounding spaces"))
        elif key in seen:
            errors.append(FieldError(f"{where}.key", f"{key!r} appears twice"))
        seen.add(key)
        if not isinstance(inputs, dict):
            errors.append(FieldError(f"{where}.inputs", "must be a mapping of input names to values"))
        elif missing := sorted(needed - set(inputs)):
            errors.append(FieldError(f"{where}.inputs", f"missing {', '.join(missing)} (used by prompt_template)"))
        if not isinstance(hidden, dict):
            errors.append(FieldError(f"{where}.hidden", "must be a mapping (references, tests)"))
        problem = data_problem(item.get("inputs"), where="inputs") or data_problem(item.get("hidden"), where="hidden")
        if problem or not _is_unicode_key(key):
            errors.append(FieldError(where, problem or "the key holds a lone surrogate, which is not Unicode text"))
        if len(errors) >= 50:
            errors.append(FieldError("instances", "stopped after 50 errors"))
            break
    if errors:
        raise SpecError(errors)


def _instance_set_store(*, definition: Definition, instances: list[dict]) -> InstanceSet:
    """Store instances once per definition (content-addressed) and the set that lists them; returns the set.

    Only instances this definition has never stored are inserted, so changing one instance of 20,000 writes
    one instance row (and the new set's member rows).
    """
    rows = {}
    for item in instances:
        inputs, hidden = item["inputs"], item.get("hidden", {})
        rows[item["key"]] = (instance_hash(item["key"], inputs, hidden), inputs, hidden)
    digest = instance_set_digest({key: row[0] for key, row in rows.items()})
    existing = InstanceSet.objects.filter(definition=definition, digest=digest).first()
    if existing:
        return existing

    def stored_ids() -> dict[str, int]:
        return dict(TaskInstance.objects.filter(definition=definition).values_list("content_hash", "id"))

    ids = stored_ids()
    new = [(definition.pk, key, h, json_text(inputs), json_text(hidden))
           for key, (h, inputs, hidden) in rows.items() if h not in ids]
    if new:
        bulk_insert(TaskInstance._meta.db_table, ["definition_id", "key", "content_hash", "inputs", "hidden"], new)
        ids = stored_ids()
    instance_set = InstanceSet.objects.create(definition=definition, digest=digest, count=len(rows))
    bulk_insert(InstanceSetMember._meta.db_table, ["instance_set_id", "key", "instance_id"],
                [(instance_set.pk, key, ids[row[0]]) for key, row in rows.items()])
    return instance_set


def alias_move(*, version: Version, name: str, actor, via: str = "web") -> Alias:
    if name == LATEST:
        raise SpecError([FieldError("name", "'latest' always means the newest version and cannot be moved")])
    if not re.fullmatch(ALIAS_RE, name):
        raise SpecError([FieldError("name", f"{name!r}: an alias is lowercase letters, digits and hyphens, "
                                            "starting with a letter, at most 63")])
    with transaction.atomic():
        alias = Alias.objects.select_for_update().filter(definition=version.definition, name=name).first()
        previous = alias.version.number if alias else None
        if alias is None:
            alias = Alias.objects.create(definition=version.definition, name=name, version=version)
        elif alias.version_id != version.pk:
            alias.version = version
            alias.save(update_fields=["version", "updated_at"])
        else:
            return alias
        audit_record(project=version.definition.project, actor=actor, action="alias.move",
                     target=f"{version.definition}@{name}", details={"from": previous, "to": version.number}, via=via)
        return alias


def _is_unicode_key(key) -> bool:
    return not isinstance(key, str) or data_problem(key) is None

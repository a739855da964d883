"""The registry part of the REST API: definitions, their versions, diffs, task instances, aliases and bundles.

Views stay thin: look the project up for the caller's role, call one selector or service, return its result.
Errors (SpecError, VersionNotFound, PublishConflict, ...) are turned into JSON answers in apps/common/api_errors.py.
"""

from ninja import Query, Router, Status

from apps.accounts.api_auth import caller_project
from apps.accounts.models import Project, Role
from apps.common.api_errors import READ_ERRORS, WRITE_ERRORS
from workers.definitions.specs import KINDS, SPEC_SCHEMA_VERSION

from . import selectors, services
from .api_schemas import (
    DOCUMENTED_SPECS,
    MAX_NUMBER,
    PUBLISH_BODIES,
    AliasMoveIn,
    AliasName,
    AliasOut,
    BundleOut,
    ChangeOut,
    DefinitionDetailOut,
    DefinitionOut,
    InstancePage,
    KindName,
    PublishedOut,
    PublishIn,
    Slug,
    ValidateIn,
    ValidationOut,
    VersionOut,
    VersionPage,
    VersionSelector,
    VersionSelectorQuery,
)
from .diff import spec_diff
from .errors import FieldError, ReferenceNotFound, SpecError, VersionNotFound
from .models import Version
from .refs import Ref

router = Router(tags=["registry"])

DEFINITION = "/projects/{project}/definitions/{kind}/{slug}"



@router.get("/schemas", response={200: dict, **READ_ERRORS})
def spec_schemas(request):
    """The JSON Schema of every kind's spec at the current spec schema version: what an editor completes and
    validates against, and what the API's publish checks (a few checks — a verifier's code, a reference's fields
    — are made on publish beyond what JSON Schema can say)."""
    return {"schema_version": SPEC_SCHEMA_VERSION, "kinds": {kind: spec_json_schema(kind) for kind in KINDS}}


@router.get("/schemas/{kind}", response={200: dict, **READ_ERRORS})
def spec_schema(request, kind: KindName):
    """The JSON Schema of one kind's spec."""
    return spec_json_schema(kind)


def spec_json_schema(kind: str) -> dict:
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "$id": f"/api/v1/schemas/{kind}",
            "x-schema-version": SPEC_SCHEMA_VERSION, **DOCUMENTED_SPECS[kind].model_json_schema(mode="validation")}


def _version(project: Project, kind: str, slug: str, selector: str) -> Version:
    return selectors.version_resolve(project=project, ref=Ref(kind, slug, selector))


# Registered before the `{kind}` paths: Django tries URL patterns in order, and the generic path (GET only) would
# otherwise answer a POST to a kind's path with 405.
def _instances(payload: PublishIn) -> list[dict] | None:
    """A template's instances as sent; None (keep the previous version's) when left out, or for other kinds."""
    instances = getattr(payload, "instances", None)
    return None if instances is None else [item.model_dump() for item in instances]


def _publish_operation(kind: str, body: type[PublishIn]):
    def publish(request, project: str, slug: Slug, payload: body):
        published = services.version_publish(
            project=caller_project(request, project, min_role=Role.EDITOR),
            kind=kind,
            slug=slug,
            spec=payload.spec,
            author=request.auth,
            message=payload.message,
            description=payload.description,
            instances=_instances(payload),
            expected_head=payload.expected_head,
            via="api",
        )
        return Status(201 if published.created else 200, {"created": published.created, "version": published.version})

    # One operation per kind, so that each operation's body names its kind's spec schema (a client generated from
    # the document gets typed specs, and a fuzzer sends specs of the right shape).
    publish.__name__ = f"publish_{kind}_version"
    publish.__doc__ = (f"Publish the next version of a {kind.replace('_', ' ')}. 201 when a version was created; "
                       "200 (created: false) with the newest version when the spec and instances are identical to "
                       "it, so re-running a publish script is harmless. A spec is checked as "
                       "`POST .../validate` checks it; 422 lists every problem with its field path.")
    return publish


def _list_operation(kind: str):
    def list_kind_versions(request, project: str, slug: Slug, limit: int = Query(50, ge=1, le=200),
                           before: int | None = Query(None, ge=1, le=MAX_NUMBER,
                                                      description="list versions older than this")):
        return list_versions(request, project, kind, slug, limit, before)

    list_kind_versions.__name__ = f"list_{kind}_versions"
    list_kind_versions.__doc__ = f"The {kind.replace('_', ' ')}'s versions newest first, without their specs, a page " \
                                 "at a time."
    return list_kind_versions


for _kind in KINDS:
    _path = f"/projects/{{project}}/definitions/{_kind}/{{slug}}/versions"
    router.post(_path, response={(200, 201): PublishedOut, **WRITE_ERRORS})(
        _publish_operation(_kind, PUBLISH_BODIES[_kind]))
    # The path's GET: a request for a kind's versions reaches this path before the `{kind}` one, so it is here
    # that the listing is documented (an OPTIONS answer's Allow then matches the document).
    router.get(_path, response={200: VersionPage, **READ_ERRORS})(_list_operation(_kind))


@router.get("/projects/{project}/definitions", response={200: list[DefinitionOut], **READ_ERRORS})
def list_definitions(request, project: str, kind: KindName | None = None):
    """Every definition in the project, optionally of one kind."""
    return selectors.definition_list(project=caller_project(request, project), kind=kind)


@router.get(DEFINITION, response={200: DefinitionDetailOut, **READ_ERRORS})
def get_definition(request, project: str, kind: KindName, slug: Slug):
    """One definition with its aliases and its newest versions."""
    scope = caller_project(request, project)
    definition = selectors.definition_get(project=scope, kind=kind, slug=slug)
    return selectors.definition_list(project=scope, kind=kind).get(pk=definition.pk)  # with the counts


@router.get(DEFINITION + "/versions", response={200: VersionPage, **READ_ERRORS}, include_in_schema=False)
def list_versions(request, project: str, kind: KindName, slug: Slug,
                  limit: int = Query(50, ge=1, le=200),
                  before: int | None = Query(None, ge=1, le=MAX_NUMBER, description="list versions older than this")):
    """Versions newest first, without their specs, a page at a time."""
    definition = selectors.definition_get(project=caller_project(request, project), kind=kind, slug=slug)
    versions = selectors.version_list(definition=definition).select_related("definition", "instance_set")
    if before is not None:
        versions = versions.filter(number__lt=before)
    page = list(versions[:limit + 1])
    return {"items": page[:limit], "next_before": page[limit - 1].number if len(page) > limit else None}


@router.post(DEFINITION + "/versions", response={422: dict}, include_in_schema=False)
def publish_unknown_kind(request, project: str, kind: KindName, slug: Slug):
    """Reached only by a kind no publish operation has (each kind's path comes first): answers 422 naming the
    kinds, from the validation of `kind`, rather than 405."""
    raise AssertionError(f"{kind} has its own publish operation")  # pragma: no cover - ninja refuses `kind` first


@router.post(DEFINITION + "/validate", response={200: ValidationOut, **WRITE_ERRORS})
def validate_version(request, project: str, kind: KindName, slug: Slug, payload: ValidateIn):
    """Check a spec as publishing it as the next version of kind/slug would, without publishing: `valid`, every
    problem with its field path (the ones a publish would answer with 422), and the spec as it would be stored."""
    scope = caller_project(request, project, min_role=Role.EDITOR)
    try:
        normalised = services.spec_check(project=scope, kind=kind, slug=slug, spec=payload.spec)
    except SpecError as exc:
        return {"valid": False, "errors": exc.errors, "spec": None}
    return {"valid": True, "errors": [], "spec": normalised}


@router.get(DEFINITION + "/versions/{ref}", response={200: VersionOut, **READ_ERRORS})
def get_version(request, project: str, kind: KindName, slug: Slug, ref: VersionSelector):
    """One version by number, alias or `latest`."""
    return _version(caller_project(request, project), kind, slug, ref)


@router.get(DEFINITION + "/diff", response={200: list[ChangeOut], **READ_ERRORS})
def diff_versions(request, project: str, kind: KindName, slug: Slug, a: VersionSelectorQuery,
                  b: VersionSelectorQuery):
    """What changed from version a to version b, field by field."""
    scope = caller_project(request, project)
    old, new = _version(scope, kind, slug, a), _version(scope, kind, slug, b)
    return spec_diff(old.spec, new.spec)


@router.get("/projects/{project}/definitions/task_template/{slug}/versions/{ref}/instances",
            response={200: InstancePage, **READ_ERRORS})
def list_instances(request, project: str, slug: Slug, ref: VersionSelector,
                   after: str = Query("", max_length=200, description="the last key of the previous page"),
                   limit: int = Query(100, ge=1, le=1000)):
    """A task template version's instances in key order, a page at a time."""
    version = _version(caller_project(request, project), "task_template", slug, ref)
    page = selectors.instance_page(version=version, after_key=after, limit=limit + 1)
    return {"items": page[:limit], "next_after": page[limit - 1].key if len(page) > limit else None}


@router.get(DEFINITION + "/aliases", response={200: list[AliasOut], **READ_ERRORS})
def list_aliases(request, project: str, kind: KindName, slug: Slug):
    definition = selectors.definition_get(project=caller_project(request, project), kind=kind, slug=slug)
    return selectors.alias_list(definition=definition)


@router.put(DEFINITION + "/aliases/{name}", response={200: AliasOut, **WRITE_ERRORS})
def move_alias(request, project: str, kind: KindName, slug: Slug, name: AliasName, payload: AliasMoveIn):
    """Point an alias (created if new) at a version."""
    scope = caller_project(request, project, min_role=Role.EDITOR)
    selectors.definition_get(project=scope, kind=kind, slug=slug)  # 404 for the path before 422 for the body
    try:
        version = _version(scope, kind, slug, str(payload.version))
    except VersionNotFound as exc:  # an unknown id in the body: 404, naming the field
        raise ReferenceNotFound([FieldError("version", str(exc))]) from None
    return services.alias_move(version=version, name=name, actor=request.auth, via="api")


@router.get("/projects/{project}/bundles/{slug}/versions/{ref}", response={200: BundleOut, **READ_ERRORS})
def get_bundle(request, project: str, slug: Slug, ref: VersionSelector):
    """A bundle version with its pinned members and the whole closure it resolves to."""
    return _version(caller_project(request, project), "bundle", slug, ref)

"""Request and response shapes of the registry API. Responses are built from the models by the resolvers here,
so every endpoint that returns a version returns the same fields."""

from datetime import datetime
from typing import Annotated, Any, Literal

from ninja import Field, Path, Query, Schema
from pydantic import ConfigDict, PlainValidator, create_model
from pydantic_core import PydanticCustomError

from apps.accounts.models import SLUG_PATTERN
from workers.definitions.specs import ALIAS_RE, KINDS, SPEC_MODELS, BundleSpec
from workers.rl.config import run_config_schema

from .models import Alias, Definition, InstanceSetMember, Version
from .selectors import alias_list, version_list

RECENT_VERSIONS = 50  # in a definition's detail; the /versions endpoint pages through all of them
MAX_NUMBER = 2**31 - 1  # a version number; larger integers are refused before they reach the database

KindName = Literal[KINDS]
Slug = Annotated[str, Path(pattern=SLUG_PATTERN, description="lowercase letters, digits and hyphens")]
SELECTOR_PATTERN = r"^([1-9][0-9]{0,8}|[a-z][a-z0-9-]{0,62})$"
SELECTOR_HELP = "a version number, an alias such as prod, or latest"
VersionSelector = Annotated[str, Path(pattern=SELECTOR_PATTERN, description=SELECTOR_HELP)]
VersionSelectorQuery = Annotated[str, Query(pattern=SELECTOR_PATTERN, description=SELECTOR_HELP)]
AliasName = Annotated[str, Path(pattern=rf"^{ALIAS_RE}$",
                                description="lowercase letters, digits and hyphens starting with a letter, e.g. "
                                            "prod; not latest")]


class StrictSchema(Schema):
    # An unknown field in a request is an error: a typo must not be silently ignored.
    model_config = ConfigDict(extra="forbid")


# --- requests ---------------------------------------------------------------------------------------------


class InstanceIn(StrictSchema):
    key: str = Field(description="unique within the version; instances are paged in key order")
    inputs: dict[str, Any] = Field(description="the values the prompt template's placeholders take")
    hidden: dict[str, Any] = Field(default_factory=dict, description="references and tests the model never sees")


class PublishIn(StrictSchema):
    spec: dict[str, Any]
    message: str = Field(description="what changed and why, like a commit message")
    description: str | None = Field(None, description="replaces the definition's description when given")
    expected_head: int | None = Field(
        None, ge=0, le=MAX_NUMBER,
        description="the version your edit started from (0 for a new definition); 409 if another was published since",
    )


class PublishTemplateIn(PublishIn):
    instances: list[InstanceIn] | None = Field(
        None, description="the full list of instances; omit to keep the previous version's",
    )


def _a_mapping(value):
    if not isinstance(value, dict):
        raise PydanticCustomError("dict_type", "Input should be a valid dictionary")
    return value


def _run_config_documented(schema: dict) -> None:
    schema["properties"]["run_config"] = run_config_schema()


class DocumentedBundleSpec(BundleSpec):
    """A bundle spec whose JSON Schema also describes run_config field by field (the spec model keeps it a free
    mapping: the definitions kernel does not know the runs' configs, and check_recommended checks it)."""

    model_config = ConfigDict(title="BundleSpec", json_schema_extra=_run_config_documented)


# Each kind's spec model as the API and the editor describe it.
DOCUMENTED_SPECS = {**SPEC_MODELS, "bundle": DocumentedBundleSpec}


# The publish body of each kind: `spec` is described by the kind's spec model, but only checked to be a mapping
# here, so that the registry's own validation — the one the editor and `validate` use — reports its problems with
# their field paths, exactly as for every other client.
PUBLISH_BODIES: dict[str, type[PublishIn]] = {
    kind: create_model(
        f"Publish{kind.title().replace('_', '')}In",
        __base__=PublishTemplateIn if kind == "task_template" else PublishIn,
        spec=(Annotated[dict, PlainValidator(_a_mapping, json_schema_input_type=model)],
              Field(description=f"the {kind.replace('_', ' ')} spec; its JSON Schema is also at "
                                f"/api/v1/schemas/{kind}")),
    )
    for kind, model in DOCUMENTED_SPECS.items()
}


class ValidateIn(StrictSchema):
    spec: dict[str, Any]


class AliasMoveIn(StrictSchema):
    version: int = Field(ge=1, le=MAX_NUMBER)


# --- responses --------------------------------------------------------------------------------------------


class FieldProblemOut(Schema):
    field: str = Field(description="e.g. layers[0].checks[1].weight; empty for the spec as a whole")
    problem: str


class VersionSummaryOut(Schema):
    """A version without its spec, for lists."""

    ref: str
    kind: str
    slug: str
    number: int
    schema_version: int
    content_hash: str
    parent: int | None
    message: str
    author: str | None
    created_at: datetime
    instance_count: int | None = Field(description="task templates only")

    @staticmethod
    def resolve_kind(version: Version) -> str:
        return version.definition.kind

    @staticmethod
    def resolve_slug(version: Version) -> str:
        return version.definition.slug

    @staticmethod
    def resolve_parent(version: Version) -> int | None:
        return version.parent.number if version.parent_id else None

    @staticmethod
    def resolve_author(version: Version) -> str | None:
        return version.author.username if version.author_id else None

    @staticmethod
    def resolve_instance_count(version: Version) -> int | None:
        return version.instance_set.count if version.instance_set_id else None


class VersionOut(VersionSummaryOut):
    spec: dict[str, Any]


class PublishedOut(Schema):
    created: bool = Field(description="false when the spec was identical to the newest version, returned instead")
    version: VersionOut


class ValidationOut(Schema):
    valid: bool
    errors: list[FieldProblemOut] = Field(description="every problem, each with its field path; empty when valid")
    spec: dict[str, Any] | None = Field(description="the spec as a publish would store it (defaults filled in, "
                                                    "references pinned); null when invalid")


class VersionPage(Schema):
    items: list[VersionSummaryOut]
    next_before: int | None = Field(description="pass as ?before= for the next (older) page; null on the last")


class AliasOut(Schema):
    name: str
    version: int
    updated_at: datetime

    @staticmethod
    def resolve_version(alias) -> int:
        return alias.version.number


class DefinitionOut(Schema):
    kind: str
    slug: str
    description: str
    version_count: int
    head_number: int | None
    created_at: datetime


class DefinitionDetailOut(DefinitionOut):
    aliases: list[AliasOut]
    versions: list[VersionSummaryOut] = Field(description=f"the newest {RECENT_VERSIONS} versions, newest first; "
                                                          "page through /versions for older ones")

    @staticmethod
    def resolve_aliases(definition: Definition) -> list[Alias]:
        return list(alias_list(definition=definition))

    @staticmethod
    def resolve_versions(definition: Definition) -> list[Version]:
        recent = version_list(definition=definition).select_related("definition", "instance_set")
        return list(recent[:RECENT_VERSIONS])


class ChangeOut(Schema):
    path: str = Field(description="the field that changed, e.g. layers[0].checks[1].weight; empty for the whole spec")
    op: Literal["added", "removed", "changed"]
    old: Any = None
    new: Any = None


class InstanceOut(Schema):
    """Built from an InstanceSetMember: the key is the member's, the rest is the shared instance's."""

    key: str
    inputs: dict[str, Any]
    hidden: dict[str, Any]
    content_hash: str

    @staticmethod
    def resolve_inputs(member: InstanceSetMember) -> dict:
        return member.instance.inputs

    @staticmethod
    def resolve_hidden(member: InstanceSetMember) -> dict:
        return member.instance.hidden

    @staticmethod
    def resolve_content_hash(member: InstanceSetMember) -> str:
        return member.instance.content_hash


class InstancePage(Schema):
    items: list[InstanceOut]
    next_after: str | None = Field(description="pass as ?after= for the next page; null on the last")


class ResolvedMemberOut(Schema):
    ref: str
    content_hash: str


class BundleOut(VersionOut):
    members: list[str] = Field(description="the members as pinned on publish: kind/slug@N")
    resolved: list[ResolvedMemberOut] = Field(description="the whole closure the bundle pins, with content hashes")

    @staticmethod
    def resolve_members(version: Version) -> list[str]:
        return version.spec["members"]

    @staticmethod
    def resolve_resolved(version: Version) -> list[dict]:
        return version.lock.to_json()

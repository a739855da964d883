"""The sign-on part of the REST API: a project's identity-provider group -> role mappings (owners)."""

from datetime import datetime

from ninja import Field, Router, Schema, Status
from pydantic import ConfigDict

from apps.accounts.api_auth import caller_project
from apps.accounts.models import Role
from apps.common.api_errors import READ_ERRORS, WRITE_ERRORS
from apps.common.errors import StudioError

from .models import GroupRoleMapping
from .selectors import mapping_list
from .services import mapping_delete, mapping_set

router = Router(tags=["sign-on"])


class MappingIn(Schema):
    model_config = ConfigDict(extra="forbid")

    provider: str = Field(max_length=63, description="the identity provider's id (STUDIO_OIDC_PROVIDERS, ...)")
    group: str = Field(min_length=1, max_length=255, description="as the provider spells it in its groups claim")
    role: Role


class MappingOut(Schema):
    id: int
    provider: str
    group: str
    role: str
    created_at: datetime


@router.get("/projects/{project}/sso-mappings", response={200: list[MappingOut], **READ_ERRORS})
def list_sso_mappings(request, project: str):
    """Which identity-provider groups give which role in the project. Owners only."""
    return mapping_list(project=caller_project(request, project, min_role=Role.OWNER))


@router.post("/projects/{project}/sso-mappings", response={200: MappingOut, **WRITE_ERRORS})
def set_sso_mapping(request, project: str, payload: MappingIn):
    """Map a group to a role (or change the role a mapped group gives). Owners only. Members' roles follow at
    their next login."""
    scope = caller_project(request, project, min_role=Role.OWNER)
    return mapping_set(project=scope, provider=payload.provider, group=payload.group, role=payload.role,
                       actor=request.auth, via="api")


@router.delete("/projects/{project}/sso-mappings/{mapping_id}", response={204: None, **WRITE_ERRORS})
def delete_sso_mapping(request, project: str, mapping_id: int):
    """Remove a mapping. Owners only. The roles it gave go at each member's next login."""
    scope = caller_project(request, project, min_role=Role.OWNER)
    mapping = GroupRoleMapping.objects.filter(project=scope, pk=mapping_id).first()
    if mapping is None:
        raise StudioError(f"No sign-on mapping {mapping_id} in {scope.slug}.", status=404)
    mapping_delete(mapping=mapping, actor=request.auth, via="api")
    return Status(204, None)

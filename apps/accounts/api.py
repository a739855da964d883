"""The accounts part of the REST API: who is calling (an API token or the browser session), their projects, a
project's audit log, and the credentials its endpoints may name (owners store the project's own, write-only)."""

from datetime import datetime
from typing import Any

from django.db.models import F
from ninja import Field, Query, Router, Schema, Status
from pydantic import ConfigDict

from apps.common.api_errors import READ_ERRORS, WRITE_ERRORS

from .api_auth import caller_project
from .credentials import credential_names, project_secret_store
from .models import Role
from .selectors import audit_list, project_list_for_user

router = Router(tags=["projects"])


class ProjectOut(Schema):
    slug: str
    name: str
    team: str
    role: str

    @staticmethod
    def resolve_team(project) -> str:
        return project.team.slug


class AuditEventOut(Schema):
    action: str
    target: str
    actor: str | None
    via: str
    details: dict[str, Any]
    created_at: datetime

    @staticmethod
    def resolve_actor(event) -> str | None:
        return event.actor.username if event.actor_id else None


@router.get("/projects", response={200: list[ProjectOut], **READ_ERRORS})
def list_projects(request):
    """The projects you are a member of, with your role in each; with an API token, its one project and the
    role it acts with there."""
    # The annotation reuses the selector's join on the caller's membership: one row per project, their role.
    projects = list(project_list_for_user(user=request.auth).annotate(role=F("memberships__role"))
                    .select_related("team"))
    token = getattr(request, "api_token", None)
    if token is None:
        return projects
    for project in projects:
        project.role = min(project.role, token.ceiling, key=Role.rank)
    return [project for project in projects if project.pk == token.project_id]


@router.get("/projects/{project}/audit", response={200: list[AuditEventOut], **READ_ERRORS})
def list_audit_events(request, project: str, limit: int = Query(100, ge=1, le=1000)):
    """Every write in the project, newest first. Owners only."""
    scope = caller_project(request, project, min_role=Role.OWNER)
    return audit_list(project=scope, limit=limit)


class SecretIn(Schema):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]{0,62}$", description="endpoints name it project:NAME")
    value: str = Field(min_length=1, max_length=10_000, description="the API key: stored encrypted, never shown "
                                                                    "again")


class SecretOut(Schema):
    credential: str


@router.get("/projects/{project}/credentials", response={200: list[str], **READ_ERRORS})
def list_credentials(request, project: str):
    """What the project's endpoints may name as their API key, by name only: the operator's (operator:NAME, the
    workers' STUDIO_ENDPOINT_KEY_NAME) and the keys owners stored for the project (project:NAME)."""
    return credential_names(project=caller_project(request, project))


@router.post("/projects/{project}/secrets", response={201: SecretOut, **WRITE_ERRORS})
def store_secret(request, project: str, payload: SecretIn):
    """Store (or replace) an API key for the project's endpoints (owners). It is encrypted with the studio's
    STUDIO_SECRETS_KEY and never shown again: not here, not in an export, the audit log or a log."""
    scope = caller_project(request, project, min_role=Role.OWNER)
    secret = project_secret_store(project=scope, name=payload.name, value=payload.value, actor=request.auth,
                                  via="api")
    return Status(201, {"credential": f"project:{secret.name}"})

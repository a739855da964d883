"""The accounts part of the REST API: who is calling (an API token or the browser session), their projects, and
a project's audit log."""

from datetime import datetime
from typing import Any

from django.db.models import F
from ninja import Query, Router, Schema

from apps.common.api_errors import READ_ERRORS

from .api_auth import caller_project
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

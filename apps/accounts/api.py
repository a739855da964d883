"""The accounts part of the REST API: who is calling (an API token or the browser session), their projects, and
a project's audit log."""

from datetime import datetime
from typing import Any

from django.db.models import F
from ninja import Query, Router, Schema
from ninja.errors import AuthenticationError
from ninja.security import HttpBearer, SessionAuth

from apps.common.api_errors import READ_ERRORS

from .models import Role
from .selectors import audit_list, project_for_user, project_list_for_user, user_for_token


class ApiTokenAuth(HttpBearer):
    """`Authorization: Bearer pts_...`, a token made with services.api_token_create.

    A token that is sent but unknown or revoked is refused outright instead of falling back to the browser
    session: a script with a dead token should fail loudly, not run as whoever is signed in.
    """

    def authenticate(self, request, token: str):
        user = user_for_token(plaintext=token)
        if user is None:
            raise AuthenticationError(message="This API token is unknown or has been revoked; create a new one "
                                              "in your account settings.")
        request.user = user  # so code below the API sees one user however the caller signed in
        return user


class BrowserSession(SessionAuth):
    """The signed-in browser (ninja's django_auth). CSRF is checked only once there is a signed-in session, so
    an anonymous request gets 401 rather than a misleading CSRF 403."""

    def __call__(self, request):
        if not request.user.is_authenticated:
            return None
        return super().__call__(request)


api_auth = [ApiTokenAuth(), BrowserSession()]

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
    """The projects you are a member of, with your role in each."""
    # The annotation reuses the selector's join on the caller's membership: one row per project, their role.
    return project_list_for_user(user=request.auth).annotate(role=F("memberships__role")).select_related("team")


@router.get("/projects/{project}/audit", response={200: list[AuditEventOut], **READ_ERRORS})
def list_audit_events(request, project: str, limit: int = Query(100, ge=1, le=1000)):
    """Every write in the project, newest first. Owners only."""
    scope = project_for_user(user=request.auth, slug=project, min_role=Role.OWNER)
    return audit_list(project=scope, limit=limit)

"""Reads for accounts: who may see and do what in which project."""

from datetime import timedelta

from django.core.exceptions import PermissionDenied
from django.db.models import F, QuerySet
from django.http import Http404
from django.utils import timezone

from .models import ApiToken, AuditEvent, Membership, Project, Role, TokenScope
from .services import token_digest

LAST_USED_RESOLUTION = timedelta(minutes=1)


def project_list_for_user(*, user) -> QuerySet[Project]:
    if not user.is_authenticated:
        return Project.objects.none()
    return Project.objects.filter(memberships__user=user).order_by("slug")


def role_of(*, user, project: Project) -> str | None:
    if not user.is_authenticated:
        return None
    return Membership.objects.filter(project=project, user=user).values_list("role", flat=True).first()


def project_for_user(*, user, slug: str, min_role: str = Role.VIEWER) -> Project:
    """The project if `user` holds at least `min_role` in it.

    A non-member gets 404, not 403: the existence of another team's project is itself private.
    """
    project = Project.objects.filter(slug=slug).first()
    role = role_of(user=user, project=project) if project else None
    if role is None:
        raise Http404(f"No project {slug!r}.")
    if Role.rank(role) < Role.rank(min_role):
        raise PermissionDenied(f"Your role in {slug!r} is {role}; this needs {min_role} or above.")
    return project


def project_for_page(*, user, slug: str, min_role: str = Role.VIEWER) -> tuple[Project, bool]:
    """The project (as project_for_user finds it) and whether `user` may edit in it, which decides whether a
    page shows its edit controls."""
    project = project_for_user(user=user, slug=slug, min_role=min_role)
    return project, Role.rank(role_of(user=user, project=project)) >= Role.rank(Role.EDITOR)


def token_for_plaintext(*, plaintext: str) -> ApiToken | None:
    """The live token (not revoked, not expired, scoped to a project, its user active), or None. A SCIM token is
    never one: it has no project, and it is good at /scim/v2 only (scim_token_for_plaintext)."""
    return _live_token(plaintext=plaintext, scim=False)


def scim_token_for_plaintext(*, plaintext: str) -> ApiToken | None:
    """The live SCIM token (TokenScope.SCIM, no project; not revoked, not expired, its user active), or None."""
    return _live_token(plaintext=plaintext, scim=True)


def _live_token(*, plaintext: str, scim: bool) -> ApiToken | None:
    if not plaintext.startswith("pts_"):
        return None
    now = timezone.now()
    tokens = ApiToken.objects.select_related("user", "project").filter(digest=token_digest(plaintext),
                                                                       revoked_at__isnull=True)
    if scim:
        tokens = tokens.filter(scope=TokenScope.SCIM, project__isnull=True)
    else:
        tokens = tokens.filter(project__isnull=False).exclude(scope=TokenScope.SCIM)
    token = tokens.exclude(expires_at__lte=now).first()
    if token is None or not token.user.is_active:
        return None
    # At most one write a minute per token: a read-only API call should not take the database's write lock.
    if token.last_used_at is None or now - token.last_used_at > LAST_USED_RESOLUTION:
        ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
    return token


def project_for_caller(*, user, slug: str, min_role: str = Role.VIEWER, token: ApiToken | None = None) -> Project:
    """project_for_user, within what the caller's API token allows (None: a signed-in browser, the user's own
    roles): the token's one project — another is as absent as a project the user is not a member of — and at
    most the token's scope, whatever the user's role."""
    if token is None:
        return project_for_user(user=user, slug=slug, min_role=min_role)
    project = project_for_user(user=user, slug=slug)
    if project.pk != token.project_id:
        raise Http404(f"No project {slug!r}.")
    role = role_of(user=user, project=project)
    if Role.rank(role) < Role.rank(min_role):
        raise PermissionDenied(f"Your role in {slug!r} is {role}; this needs {min_role} or above.")
    if Role.rank(token.ceiling) < Role.rank(min_role):
        raise PermissionDenied(f"This API token's scope is {token.scope} (a {token.ceiling}'s rights); this needs "
                               f"{min_role} or above. Create a token with a wider scope on the API tokens page.")
    return project


def audit_list(*, project: Project, limit: int = 100) -> QuerySet[AuditEvent]:
    """Every write in the project, newest first."""
    return AuditEvent.objects.filter(project=project).select_related("actor").order_by("-created_at", "-id")[:limit]


def api_token_list(*, user) -> QuerySet[ApiToken]:
    """Live tokens first, newest first."""
    return (ApiToken.objects.filter(user=user).select_related("project")
            .order_by(F("revoked_at").asc(nulls_first=True), "-created_at"))


def project_for_command(*, slug: str | None) -> Project:
    """The project a management command acts on: the one named, or the only one there is.

    Raises LookupError with the projects that exist, for the command to show.
    """
    names = ", ".join(Project.objects.order_by("slug").values_list("slug", flat=True)) or "none"
    if slug:
        project = Project.objects.filter(slug=slug).first()
        if project is None:
            raise LookupError(f"No project {slug!r}; projects: {names}.")
        return project
    projects = list(Project.objects.all()[:2])
    if len(projects) != 1:
        raise LookupError(f"Name the project with --project (projects: {names}).")
    return projects[0]

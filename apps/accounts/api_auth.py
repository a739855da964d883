"""Who calls the REST API, and what they may do: an API token (one project, a scope, maybe an expiry) or the
signed-in browser (the user's own roles). Every API router finds its project through `caller_project`."""

from ninja.errors import AuthenticationError
from ninja.security import HttpBearer, SessionAuth

from .models import Project, Role
from .selectors import project_for_caller, scim_token_for_plaintext, token_for_plaintext


class ApiTokenAuth(HttpBearer):
    """`Authorization: Bearer pts_...`, a token made with services.api_token_create.

    A token that is sent but unknown or revoked is refused outright instead of falling back to the browser
    session: a script with a dead token should fail loudly, not run as whoever is signed in.
    """

    def authenticate(self, request, token: str):
        found = token_for_plaintext(plaintext=token)
        if found is None and scim_token_for_plaintext(plaintext=token) is not None:
            raise AuthenticationError(message="This is a SCIM token: it works only at /scim/v2/, for the identity "
                                              "provider's provisioning. Use a project's API token here.")
        if found is None:
            raise AuthenticationError(message="This API token is unknown, expired or revoked; create a new one on "
                                              "the API tokens page.")
        request.user = found.user  # so code below the API sees one user however the caller signed in
        request.api_token = found  # its project and scope bound what the caller may do (caller_project)
        return found.user


class BrowserSession(SessionAuth):
    """The signed-in browser (ninja's django_auth). CSRF is checked only once there is a signed-in session, so
    an anonymous request gets 401 rather than a misleading CSRF 403."""

    def __call__(self, request):
        if not request.user.is_authenticated:
            return None
        return super().__call__(request)


api_auth = [ApiTokenAuth(), BrowserSession()]


def caller_project(request, slug: str, *, min_role: str = Role.VIEWER) -> Project:
    """The project `slug` if the caller may act in it with at least `min_role` (404 for a project they are not a
    member of, or that their token is not for; 403 for too small a role or scope)."""
    return project_for_caller(user=request.auth, slug=slug, min_role=min_role,
                              token=getattr(request, "api_token", None))

"""Who may play a served project's environments: the holder of a live API token of that project with the
`environment` scope (accounts' TokenScope.ENVIRONMENT), who is an editor or an owner there, since their episodes
become runs of the project. The token comes as a bearer token, or as the password of HTTP Basic authentication
(what OpenEnv's clients send for a server URL written `http://name:TOKEN@host:port`)."""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass

from apps.accounts.models import Project, Role, TokenScope
from apps.accounts.selectors import role_of, token_for_plaintext
from apps.common.errors import StudioError


class AccessRefused(StudioError):
    status = 401


@dataclass(frozen=True)
class Caller:
    """A token holder the server admitted: whose episodes are recorded, and which token's sessions they count to."""

    token_id: int
    token_name: str  # the run its episodes go to when a reset names none
    user: object  # the token's user (auth.User)

    def __str__(self) -> str:
        return f"{self.user} (token {self.token_name})"


def presented_token(authorization: str) -> str:
    """The token in an Authorization header: `Bearer TOKEN`, or `Basic base64(NAME:TOKEN)`; "" for none."""
    scheme, _, value = authorization.strip().partition(" ")
    if scheme.lower() == "bearer":
        return value.strip()
    if scheme.lower() == "basic":
        try:
            return base64.b64decode(value.strip(), validate=True).decode().partition(":")[2]
        except (binascii.Error, UnicodeDecodeError):
            return ""
    return ""


def environment_caller(*, plaintext: str, project: Project) -> Caller:
    """The caller `plaintext` admits to `project`'s environments; AccessRefused (401 or 403) says why not and what
    to do instead."""
    if not plaintext:
        raise AccessRefused("an API token is needed: send `Authorization: Bearer pts_...`, or put it in the server's "
                            "URL as http://NAME:TOKEN@host:port; create one with the environment scope on the API "
                            "tokens page")
    token = token_for_plaintext(plaintext=plaintext)
    if token is None:
        raise AccessRefused("this API token is unknown, expired or revoked; create one with the environment scope on "
                            "the API tokens page")
    if token.scope != TokenScope.ENVIRONMENT:
        raise AccessRefused(f"this API token's scope is {token.scope}; playing environments takes a token with the "
                            "environment scope (create one on the API tokens page)", status=403)
    if token.project_id != project.pk:
        raise AccessRefused(f"this API token is for project {token.project.slug}; this server serves project "
                            f"{project.slug}", status=403)
    role = role_of(user=token.user, project=project)
    if role is None or Role.rank(role) < Role.rank(Role.EDITOR):
        raise AccessRefused(f"episodes are recorded as runs of {project.slug}, which takes an editor or an owner; "
                            f"this token's holder is {role or 'not a member'} there", status=403)
    return Caller(token_id=token.pk, token_name=token.name, user=token.user)

"""Writes for accounts. Each takes keyword-only arguments, runs in one transaction and writes an audit row."""

import hashlib
import secrets
from datetime import datetime

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import transaction
from django.utils import timezone

from .models import ApiToken, AuditEvent, Membership, Project, Role, Team, TokenScope

User = get_user_model()


def audit_record(*, project: Project | None, actor, action: str, target: str, details: dict | None = None,
                 via: str = "web") -> AuditEvent:
    """Called inside the caller's transaction, so the audit row and the write commit or vanish together."""
    return AuditEvent.objects.create(
        project=project,
        actor=actor if getattr(actor, "is_authenticated", False) else None,
        action=action,
        target=target,
        details=details or {},
        via=via,
    )


def project_create(*, team_slug: str, slug: str, name: str, owner, via: str = "web") -> Project:
    with transaction.atomic():
        team, _ = Team.objects.get_or_create(slug=team_slug, defaults={"name": team_slug})
        project = Project(team=team, slug=slug, name=name)
        project.full_clean()
        project.save()
        Membership.objects.create(project=project, user=owner, role=Role.OWNER)
        audit_record(project=project, actor=owner, action="project.create", target=f"project/{slug}", via=via)
        return project


def membership_set(*, project: Project, user, role: str, actor, via: str = "web") -> Membership:
    if role not in Role.values:
        raise ValueError(f"Unknown role {role!r}; choose one of {', '.join(Role.values)}.")
    with transaction.atomic():
        # Set by hand: a sign-on login no longer recomputes this role (granted_by "").
        membership, _ = Membership.objects.update_or_create(project=project, user=user,
                                                            defaults={"role": role, "granted_by": ""})
        audit_record(project=project, actor=actor, action="membership.set", target=f"user/{user.username}",
                     details={"role": role}, via=via)
        return membership


def token_digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def api_token_create(*, user, name: str, project: Project, scope: str = TokenScope.READ,
                     expires_at: datetime | None = None, via: str = "web") -> tuple[ApiToken, str]:
    """A token for `project` with `scope` (read, review, write, admin, environment), valid until `expires_at` (None:
    until revoked). Returns the row and the plaintext token; the plaintext is never stored and cannot be shown
    again."""
    if scope not in TokenScope.values:
        raise ValueError(f"Unknown scope {scope!r}; choose one of {', '.join(TokenScope.values)}.")
    if scope == TokenScope.SCIM:
        raise ValueError("A SCIM token belongs to no project: an operator makes one with `manage.py scim_token "
                         "create`.")
    role = Membership.objects.filter(project=project, user=user).values_list("role", flat=True).first()
    if role is None:
        raise ValueError(f"You are not a member of {project.slug}: a token can only act where you can.")
    if scope == TokenScope.ENVIRONMENT and Role.rank(role) < Role.rank(Role.EDITOR):
        raise ValueError(f"An environment token records its trainer's episodes as runs of {project.slug}: that "
                         f"needs an editor or an owner, and your role there is {role}.")
    return _token_create(user=user, name=name, project=project, scope=scope, expires_at=expires_at, via=via)


def scim_token_create(*, user, provider: str, name: str, expires_at: datetime | None = None,
                      via: str = "cli") -> tuple[ApiToken, str]:
    """A SCIM token (TokenScope.SCIM, no project: apps/sso/scim.py) for the identity provider `provider` (an OpenID
    Connect or SAML provider of settings.SIGN_ON_PROVIDERS), held by `user`, an active staff account: whoever holds
    it creates and deactivates that provider's people, so no project role is enough. Returns the row and the
    plaintext, which is shown once and never stored."""
    if not (user.is_active and user.is_staff):
        raise ValueError(f"{user.username} is not an active staff account: a SCIM token creates and deactivates "
                         "people studio-wide, so only an operator may hold one (mark the account staff in the "
                         "admin).")
    logins = sorted(pid for pid, p in settings.SIGN_ON_PROVIDERS.items() if p["protocol"] in ("oidc", "saml"))
    if provider not in logins:
        raise ValueError(f"No identity provider {provider!r} to provision for: a SCIM token belongs to the provider "
                         "its people log in with, one of STUDIO_OIDC_PROVIDERS or STUDIO_SAML_PROVIDERS "
                         f"(configured: {', '.join(logins) or 'none'}).")
    return _token_create(user=user, name=name, project=None, scope=TokenScope.SCIM, expires_at=expires_at, via=via,
                         provider=provider)


def _token_create(*, user, name: str, project: Project | None, scope: str, expires_at: datetime | None,
                  via: str, provider: str = "") -> tuple[ApiToken, str]:
    if expires_at is not None and expires_at <= timezone.now():
        raise ValueError("The expiry must be in the future.")
    prefix = secrets.token_hex(4)
    plaintext = f"pts_{prefix}_{secrets.token_urlsafe(32)}"
    with transaction.atomic():
        token = ApiToken.objects.create(user=user, name=name, project=project, scope=scope, expires_at=expires_at,
                                        prefix=prefix, digest=token_digest(plaintext), provider=provider)
        details = {"name": name, "scope": scope, "expires_at": expires_at.isoformat() if expires_at else None}
        if provider:
            details["provider"] = provider
        audit_record(project=project, actor=user, action="token.create", target=f"token/{prefix}", details=details,
                     via=via)
    return token, plaintext


def api_token_revoke(*, token: ApiToken, actor, via: str = "web") -> None:
    with transaction.atomic():
        ApiToken.objects.filter(pk=token.pk).update(revoked_at=timezone.now())
        audit_record(project=token.project, actor=actor, action="token.revoke", target=f"token/{token.prefix}",
                     details={"name": token.name}, via=via)

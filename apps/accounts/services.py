"""Writes for accounts. Each takes keyword-only arguments, runs in one transaction and writes an audit row."""

import hashlib
import secrets

from django.contrib.auth import get_user_model
from django.db import transaction
from django.utils import timezone

from .models import ApiToken, AuditEvent, Membership, Project, Role, Team

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
        membership, _ = Membership.objects.update_or_create(project=project, user=user, defaults={"role": role})
        audit_record(project=project, actor=actor, action="membership.set", target=f"user/{user.username}",
                     details={"role": role}, via=via)
        return membership


def token_digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def api_token_create(*, user, name: str, via: str = "web") -> tuple[ApiToken, str]:
    """Returns the row and the plaintext token; the plaintext is never stored and cannot be shown again."""
    prefix = secrets.token_hex(4)
    plaintext = f"pts_{prefix}_{secrets.token_urlsafe(32)}"
    with transaction.atomic():
        token = ApiToken.objects.create(user=user, name=name, prefix=prefix, digest=token_digest(plaintext))
        audit_record(project=None, actor=user, action="token.create", target=f"token/{prefix}", via=via)
    return token, plaintext


def api_token_revoke(*, token: ApiToken, actor, via: str = "web") -> None:
    with transaction.atomic():
        ApiToken.objects.filter(pk=token.pk).update(revoked_at=timezone.now())
        audit_record(project=None, actor=actor, action="token.revoke", target=f"token/{token.prefix}", via=via)

"""Writes for sign-on: who an identity provider's login admits, the roles its groups give, and the mappings that
decide both. Each takes keyword-only arguments, runs in one transaction and writes audit rows (the protocols call
these: apps/sso/adapters.py for OpenID Connect and SAML)."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

from allauth.socialaccount.models import SocialAccount
from django.contrib.auth import get_user_model
from django.db import transaction

from apps.accounts.models import Membership, Project, Role
from apps.accounts.selectors import role_of
from apps.accounts.services import audit_record
from apps.common.errors import StudioError

from .models import GroupRoleMapping, ScimUser
from .selectors import scim_groups, scim_match_claim, sign_on_providers

User = get_user_model()

# The audit log's `via` of what a login through a provider did (the person's own roles changing).
VIA = "sso"
# How many of a person's groups an audit row or a refusal page lists: a directory may put hundreds in the claim.
GROUPS_SHOWN = 50


class SsoRefused(StudioError):
    """The identity provider vouched for this person, but the studio does not admit them: no project maps any of
    their groups to a role (and they hold none by hand), or their studio account is deactivated."""

    status = 403


@dataclass(frozen=True)
class RoleChange:
    project: Project
    action: str  # membership.sso_grant | membership.sso_change | membership.sso_remove
    from_role: str | None
    to_role: str | None


def groups_from_claims(claims: dict, claim: str) -> list[str]:
    """The person's groups as the provider sent them in `claim`: a list of names (Okta, Keycloak), of ids (Entra
    ID), or one string (Google's `hd`, the Workspace domain). Anything else counts as no groups."""
    value = claims.get(claim)
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list):
        return []
    return sorted({item for item in value if isinstance(item, str) and item})


def _mapped_roles(*, provider: str, groups: list[str]) -> dict[int, tuple[str, list[str]]]:
    """project id -> (the highest role the groups map to there, the groups that map to it)."""
    best: dict[int, tuple[str, list[str]]] = {}
    for mapping in GroupRoleMapping.objects.filter(provider=provider, group__in=groups).order_by("group"):
        held = best.get(mapping.project_id)
        if held is None or Role.rank(mapping.role) > Role.rank(held[0]):
            best[mapping.project_id] = (mapping.role, [mapping.group])
        elif mapping.role == held[0]:
            held[1].append(mapping.group)
    return best


def roles_apply_from_claims(*, user, provider: str, groups: list[str], claim: str) -> list[RoleChange]:
    """Recompute the roles `provider`'s mappings give `user` from the groups it just sent (in its claim `claim`):
    the highest role any group maps to in each project; a role this provider granted that no group maps to
    anymore is removed. A role granted by hand (or by another provider) is never touched. Each change is an audit
    row naming the provider, the claim and the groups that caused it."""
    changes: list[RoleChange] = []
    with transaction.atomic():
        wanted = _mapped_roles(provider=provider, groups=groups)
        held = {m.project_id: m for m in Membership.objects.select_for_update().select_related("project")
                .filter(user=user)}
        for project_id, (role, because) in wanted.items():
            membership = held.get(project_id)
            if membership is None:
                membership = Membership.objects.create(project_id=project_id, user=user, role=role,
                                                       granted_by=provider)
                changes.append(RoleChange(membership.project, "membership.sso_grant", None, role))
            elif membership.granted_by == provider and membership.role != role:
                changes.append(RoleChange(membership.project, "membership.sso_change", membership.role, role))
                membership.role = role
                membership.save(update_fields=["role"])
            else:
                continue
            _audit(changes[-1], user=user, provider=provider, claim=claim, groups=because)
        for project_id, membership in held.items():
            if membership.granted_by == provider and project_id not in wanted:
                membership.delete()
                changes.append(RoleChange(membership.project, "membership.sso_remove", membership.role, None))
                _audit(changes[-1], user=user, provider=provider, claim=claim, groups=groups[:GROUPS_SHOWN])
    return changes


def _audit(change: RoleChange, *, user, provider: str, claim: str, groups: list[str]) -> None:
    # No actor: the provider's claim changed the role, not a person in the studio.
    audit_record(project=change.project, actor=None, action=change.action, target=f"user/{user.username}",
                 details={"provider": provider, "claim": claim, "groups": groups, "from_role": change.from_role,
                          "to_role": change.to_role}, via=VIA)


# The claim an audit row names for groups a provider pushed over SCIM (apps/sso/provisioning.py).
SCIM_CLAIM = "scim:groups"


def provider_groups(*, user, provider: str, claim_groups: list[str], claim: str) -> tuple[list[str], str]:
    """The groups `provider` says `user` (None: a person without an account yet) is in, and the claim(s) they came
    from (for the audit rows; "" when no group came from either): for a group the provider pushes over SCIM, SCIM's
    membership decides (it is pushed at once, a removal too); for any other, the groups claim of their login
    (`claim_groups`, sent in `claim`)."""
    pushed = scim_groups(provider=provider)
    theirs = scim_groups(provider=provider, user=user) if pushed and user is not None else set()
    groups = sorted({g for g in claim_groups if g not in pushed} | theirs)
    sources = [name for name, used in ((claim, set(claim_groups) - pushed), (SCIM_CLAIM, theirs)) if used]
    return groups, " + ".join(sources)


def sso_login_admit(*, provider: str, claims: dict, groups_claim: str = "groups") -> User:
    """The studio user for the person `provider` just vouched for (`claims`: the verified ID token's or assertion's;
    `sub` is their stable id there), with their roles recomputed from the groups in `groups_claim` (and the SCIM
    groups the provider pushed: provider_groups).

    A person the provider provisioned over SCIM before their first login is that user (scim_user_for_login): the
    login is linked to them, so that what SCIM does to them later (deactivation) reaches the account they use.
    A person the studio has not seen gets an account just in time if a mapping admits them (at least one role in
    some project); otherwise none is made, and SsoRefused says why. A known person whose groups no longer map to
    any role, and who holds none by hand, loses the mapped roles and is refused. A deactivated account is refused,
    whatever their groups.
    """
    subject = claims.get("sub")
    if not isinstance(subject, str) or not subject:
        raise SsoRefused(f"{_name(provider)} sent no subject (sub) for this login, so the studio cannot tell who "
                         "logged in. Ask your administrator to check the provider's configuration.")
    claim_groups = groups_from_claims(claims, groups_claim)
    with transaction.atomic():
        account = SocialAccount.objects.select_related("user").filter(provider=provider, uid=subject).first()
        user, matched = (account.user, None) if account else scim_user_for_login(provider=provider, claims=claims)
        if user is not None and not user.is_active:
            raise SsoRefused(f"Your studio account {user.username} is deactivated (by {_name(provider)}'s "
                             "provisioning, or by an administrator), so this login is refused although the provider "
                             "vouched for you. Ask your administrator if you should still have access.")
        groups, claim = provider_groups(user=user, provider=provider, claim_groups=claim_groups, claim=groups_claim)
        if user is None:
            if not _mapped_roles(provider=provider, groups=groups):
                raise SsoRefused(_unmapped(provider, claims, groups, groups_claim))
            user = _user_create(provider=provider, subject=subject, claims=claims)
        elif matched is not None:
            _account_link(user=user, provider=provider, subject=subject, claims=claims, matched=matched)
        roles_apply_from_claims(user=user, provider=provider, groups=groups, claim=claim or groups_claim)
        admitted = Membership.objects.filter(user=user).exists()
    if not admitted:  # after the commit: the removed roles stay removed
        raise SsoRefused(_unmapped(provider, claims, groups, groups_claim))
    return user


def scim_user_for_login(*, provider: str, claims: dict) -> tuple[User | None, str | None]:
    """The user `provider`'s SCIM token provisioned for the person of this first login, and what matched ("userName"
    or "externalId"), or (None, None): their SCIM userName equal to the login's `scim_match` claim (compared without
    case, as SCIM's userName is; an OpenID `email` only when the provider says it is verified), or their externalId
    equal to its `sub` (Okta sends its user id in both). Only people this provider provisioned: never a local
    account, nor one another provider provisioned or signed on. SsoRefused if the match is ambiguous or already
    linked to another person of the provider."""
    subject, claim = claims["sub"], scim_match_claim(provider)
    value = claims.get(claim)
    if isinstance(value, list) and len(value) == 1:  # a SAML attribute: a list of values
        value = value[0]
    if claim == "email" and claims.get("email_verified") not in (True, "true"):
        value = None  # an address the person may have typed themselves must not pick an account
    found = {}
    provisioned = ScimUser.objects.filter(provider=provider).select_related("user")
    for scim in provisioned.filter(external_id=subject):
        found.setdefault(scim.user, "externalId")
    if isinstance(value, str) and value:
        for scim in provisioned.filter(user__username__iexact=value):
            found.setdefault(scim.user, "userName")
    if not found:
        return None, None
    if len(found) > 1:
        raise SsoRefused(f"{_name(provider)}'s provisioning made several studio accounts that match this login "
                         f"({', '.join(sorted(u.username for u in found))}), so the studio cannot tell which is "
                         "yours. Ask your administrator to fix the duplicate at the provider.")
    user, matched = next(iter(found.items()))
    if SocialAccount.objects.filter(user=user, provider=provider).exists():
        raise SsoRefused(f"The studio account {user.username} is linked to another login at {_name(provider)}, so "
                         "this login cannot use it. Ask your administrator to check the provider's user mapping.")
    return user, matched


def _account_link(*, user, provider: str, subject: str, claims: dict, matched: str) -> None:
    SocialAccount.objects.create(user=user, provider=provider, uid=subject, extra_data=claims)
    audit_record(project=None, actor=None, action="user.sso_link", target=f"user/{user.username}",
                 details={"provider": provider, "subject": subject, "matched": matched,
                          "claim": "sub" if matched == "externalId" else scim_match_claim(provider)}, via=VIA)


def _user_create(*, provider: str, subject: str, claims: dict):
    username = _free_username(provider=provider, subject=subject, claims=claims)
    email = claims.get("email") if isinstance(claims.get("email"), str) else ""
    user = User(username=username, email=email[:254], first_name=str(claims.get("given_name") or "")[:150],
                last_name=str(claims.get("family_name") or "")[:150])
    user.set_unusable_password()  # the provider is how this person logs in
    user.save()
    SocialAccount.objects.create(user=user, provider=provider, uid=subject, extra_data=claims)
    audit_record(project=None, actor=None, action="user.sso_create", target=f"user/{username}",
                 details={"provider": provider, "subject": subject}, via=VIA)
    return user


def _free_username(*, provider: str, subject: str, claims: dict) -> str:
    """The person's name at the provider if no one here has it; never someone else's account (a local `alice`
    is not the provider's `alice` until an administrator says so)."""
    wanted = next((value for key in ("preferred_username", "email", "sub")
                   if isinstance(value := claims.get(key), str) and value), subject)
    base = re.sub(r"[^\w.@+-]", "-", wanted)[:100] or "user"
    digest = hashlib.sha256(f"{provider}:{subject}".encode()).hexdigest()[:8]
    for candidate in (base, f"{base}-{provider}"[:150], f"{base}-{digest}"):
        if not User.objects.filter(username=candidate).exists():
            return candidate
    raise SsoRefused(f"Every name the studio would give this account ({base}) is taken; ask an administrator.")


def _name(provider: str) -> str:
    return sign_on_providers().get(provider, {}).get("name", provider)


def _unmapped(provider: str, claims: dict, groups: list[str], claim: str) -> str:
    who = next((v for k in ("preferred_username", "email") if isinstance(v := claims.get(k), str) and v), "you")
    shown = ", ".join(groups[:GROUPS_SHOWN]) or f"none (the provider sent no '{claim}' claim)"
    return (f"{_name(provider)} says {who} is in these groups: {shown}. No project here gives any of them a role, "
            "so the studio has no access for you. Ask a project owner to map one of your groups to a role on the "
            "project's Members page; then log in again.")


def _owner_check(*, project: Project, actor) -> None:
    if role_of(user=actor, project=project) != Role.OWNER:
        raise StudioError(f"Only an owner of {project.slug} may change its sign-on mappings.", status=403)


def mapping_set(*, project: Project, provider: str, group: str, role: str, actor,
                via: str = "web") -> GroupRoleMapping:
    """Map `provider`'s `group` to `role` in `project` (or change the role it maps to). Owners only. People's roles
    follow at their next login."""
    _owner_check(project=project, actor=actor)
    providers = sign_on_providers()
    if provider not in providers:
        known = ", ".join(sorted(providers)) or "none: the operator has configured no identity provider"
        raise StudioError(f"No identity provider {provider!r}; configured: {known}.", field="provider")
    group = group.strip()
    if not group or len(group) > 255:
        raise StudioError("Name the group as the provider spells it in its groups claim (1-255 characters).",
                          field="group")
    if role not in Role.values:
        raise StudioError(f"Unknown role {role!r}; choose one of {', '.join(Role.values)}.", field="role")
    with transaction.atomic():
        mapping, created = GroupRoleMapping.objects.select_for_update().get_or_create(
            project=project, provider=provider, group=group, defaults={"role": role})
        before = None if created else mapping.role
        if not created and mapping.role != role:
            mapping.role = role
            mapping.save(update_fields=["role"])
        audit_record(project=project, actor=actor, action="sso_mapping.set", target=f"group/{provider}/{group}",
                     details={"provider": provider, "group": group, "from_role": before, "to_role": role}, via=via)
    return mapping


def mapping_delete(*, mapping: GroupRoleMapping, actor, via: str = "web") -> None:
    """Remove a mapping. Owners only. The roles it gave are removed at each person's next login."""
    _owner_check(project=mapping.project, actor=actor)
    with transaction.atomic():
        mapping.delete()
        audit_record(project=mapping.project, actor=actor, action="sso_mapping.delete",
                     target=f"group/{mapping.provider}/{mapping.group}",
                     details={"provider": mapping.provider, "group": mapping.group, "role": mapping.role}, via=via)

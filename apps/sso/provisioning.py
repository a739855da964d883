"""Writes for provisioning and leaving: what the identity provider's SCIM client asks for (apps/sso/scim.py), and
user_deactivate, which ends a person's access at once. Each takes keyword-only arguments, runs in one transaction
and writes an audit row (project None: a person is the studio's, not one project's).

A SCIM token belongs to one identity provider (`provider`, its id in settings.SIGN_ON_PROVIDERS): the people and
groups it writes are that provider's. Its people's first login through that provider is linked to them
(services.sso_login_admit), and its groups are that provider's groups in the projects' mappings."""

from django.contrib.auth import get_user_model
from django.contrib.sessions.models import Session
from django.db import transaction
from django.utils import timezone

from apps.accounts.models import ApiToken
from apps.accounts.services import audit_record
from apps.common.errors import StudioError

from .scim_models import ScimGroup, ScimUser
from .selectors import last_login_claims, sign_on_providers
from .services import SCIM_CLAIM, groups_from_claims, provider_groups, roles_apply_from_claims

User = get_user_model()

# The audit rows' `via` of what the identity provider's SCIM client did.
SCIM_VIA = "scim"


class ProvisioningConflict(StudioError):
    status = 409


def _sessions_end(*, user) -> int:
    """Delete every live database session of `user`. Sessions are signed blobs keyed by a random key, so they are
    read to find the user's: one pass over the unexpired sessions, as many as people signed in."""
    ended = []
    for session in Session.objects.filter(expire_date__gt=timezone.now()).iterator():
        if session.get_decoded().get("_auth_user_id") == str(user.pk):
            ended.append(session.session_key)
    Session.objects.filter(session_key__in=ended).delete()
    return len(ended)


def user_deactivate(*, user, actor, via: str) -> dict:
    """`user` can no longer sign in, and what they hold stops working now: is_active off, every session of theirs
    deleted (their open browser is signed out at its next request), every API token of theirs revoked. Returns
    what ended."""
    with transaction.atomic():
        User.objects.filter(pk=user.pk).update(is_active=False)
        user.is_active = False
        now = timezone.now()
        tokens = list(ApiToken.objects.filter(user=user, revoked_at__isnull=True).values_list("prefix", flat=True))
        ApiToken.objects.filter(user=user, revoked_at__isnull=True).update(revoked_at=now)
        ended = {"sessions": _sessions_end(user=user), "tokens": tokens}
        audit_record(project=None, actor=actor, action="user.deactivate", target=f"user/{user.username}",
                     details={"sessions_ended": ended["sessions"], "tokens_revoked": tokens}, via=via)
    return ended


def user_activate(*, user, actor, via: str) -> None:
    """`user` may sign in again (their roles come back with their groups; revoked tokens stay revoked)."""
    with transaction.atomic():
        User.objects.filter(pk=user.pk).update(is_active=True)
        user.is_active = True
        audit_record(project=None, actor=actor, action="user.activate", target=f"user/{user.username}", via=via)


def roles_follow_scim_groups(*, user, provider: str) -> list:
    """Recompute the roles `provider`'s mappings give `user` now that its SCIM groups changed: the groups it pushes
    as SCIM says, its other groups as their last login's claim said (services.provider_groups), as a login
    recomputes them. An inactive user keeps none."""
    if not user.is_active:
        return roles_apply_from_claims(user=user, provider=provider, groups=[], claim=SCIM_CLAIM)
    groups_claim = sign_on_providers().get(provider, {}).get("groups_claim", "groups")
    claim_groups = groups_from_claims(last_login_claims(user=user, provider=provider), groups_claim)
    groups, claim = provider_groups(user=user, provider=provider, claim_groups=claim_groups, claim=groups_claim)
    return roles_apply_from_claims(user=user, provider=provider, groups=groups, claim=claim or SCIM_CLAIM)


USER_FIELDS = {"userName": "username", "givenName": "first_name", "familyName": "last_name", "email": "email"}


def scim_user_write(*, user, changes: dict, actor, provider: str):
    """Create (user None) or update a person of `provider` from a SCIM request's `changes` (userName, givenName,
    familyName, email, externalId, active). A new person is recorded as `provider`'s, has no password (they sign
    in through the identity provider) and no role until a mapped group gives one. `active` false deactivates them
    (user_deactivate); true reactivates."""
    with transaction.atomic():
        creating = user is None
        if creating:
            user = User(username=changes.get("userName", ""))
            user.set_unusable_password()
        name = changes.get("userName", user.username)
        if User.objects.filter(username=name).exclude(pk=user.pk).exists():
            raise ProvisioningConflict(f"Another user is named {name!r}: a userName must be unique.")
        changed = {}
        for key, field in USER_FIELDS.items():
            if key in changes and getattr(user, field) != changes[key]:
                changed[key] = changes[key]
                setattr(user, field, changes[key])
        if creating and changes.get("active") is False:
            user.is_active = False
        user.save()
        scim, _ = ScimUser.objects.get_or_create(user=user, defaults={"provider": provider})
        if "externalId" in changes and scim.external_id != changes["externalId"]:
            changed["externalId"] = scim.external_id = changes["externalId"]
        scim.save()
        if creating or changed:
            audit_record(project=None, actor=actor, action="user.provision" if creating else "user.update",
                         target=f"user/{user.username}", details={**changed, "provider": provider}, via=SCIM_VIA)
        if not creating and changes.get("active") is False and user.is_active:
            user_deactivate(user=user, actor=actor, via=SCIM_VIA)
            roles_follow_scim_groups(user=user, provider=provider)
        elif not creating and changes.get("active") is True and not user.is_active:
            user_activate(user=user, actor=actor, via=SCIM_VIA)
            roles_follow_scim_groups(user=user, provider=provider)
    return user


def scim_user_delete(*, user, actor, provider: str) -> None:
    """The identity provider deleted `user`: deactivated (user_deactivate), out of every SCIM group (so their
    mapped roles go), and absent from SCIM from now on. The user row stays for what they authored."""
    with transaction.atomic():
        user_deactivate(user=user, actor=actor, via=SCIM_VIA)
        user.scim_groups.clear()
        roles_follow_scim_groups(user=user, provider=provider)
        ScimUser.objects.update_or_create(user=user, defaults={"deleted_at": timezone.now()},
                                          create_defaults={"provider": provider, "deleted_at": timezone.now()})
        audit_record(project=None, actor=actor, action="user.deprovision", target=f"user/{user.username}",
                     details={"provider": provider}, via=SCIM_VIA)


def scim_group_write(*, group: ScimGroup | None, changes: dict, actor, provider: str) -> ScimGroup:
    """Create (group None) or update a SCIM group of `provider` from `changes` (displayName, externalId, members:
    the set of user ids). Everyone who joined or left it, or all its members when it was renamed or got another
    externalId, has their roles recomputed."""
    with transaction.atomic():
        creating = group is None
        group = group or ScimGroup(provider=provider)
        name = changes.get("displayName", group.display_name)
        if ScimGroup.objects.filter(provider=provider, display_name=name).exclude(pk=group.pk).exists():
            raise ProvisioningConflict(f"Another group is named {name!r}: a displayName must be unique.")
        renamed = not creating and (name != group.display_name
                                    or changes.get("externalId", group.external_id) != group.external_id)
        details = {"from_name": group.display_name} if not creating and name != group.display_name else {}
        group.display_name = name
        group.external_id = changes.get("externalId", group.external_id)
        group.save()
        before = set() if creating else set(group.members.values_list("pk", flat=True))
        after = set(changes.get("members", before))
        if after != before:
            group.members.set(after)
            names = dict(User.objects.filter(pk__in=before ^ after).values_list("pk", "username"))
            details.update(added=sorted(names[pk] for pk in after - before),
                           removed=sorted(names[pk] for pk in before - after))
        if creating or details or "externalId" in changes:
            audit_record(project=None, actor=actor, action="scim_group.create" if creating else "scim_group.update",
                         target=f"scim_group/{group.display_name}", details={**details, "provider": provider},
                         via=SCIM_VIA)
        for user in User.objects.filter(pk__in=(before | after) if renamed else (before ^ after)):
            roles_follow_scim_groups(user=user, provider=provider)
    return group


def scim_group_delete(*, group: ScimGroup, actor) -> None:
    with transaction.atomic():
        members = list(group.members.all())
        name, provider = group.display_name, group.provider
        group.delete()
        audit_record(project=None, actor=actor, action="scim_group.delete", target=f"scim_group/{name}",
                     details={"members": sorted(u.username for u in members), "provider": provider}, via=SCIM_VIA)
        for user in members:
            roles_follow_scim_groups(user=user, provider=provider)

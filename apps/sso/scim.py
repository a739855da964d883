"""SCIM 2.0 provisioning (RFC 7643/7644) on django-scim2: the identity provider creates, updates, deactivates and
deletes people at /scim/v2/Users and keeps its groups and their members at /scim/v2/Groups.

django-scim2 gives the endpoints (list with `filter`, get, create, PUT, PATCH, DELETE, .search), SCIM error bodies
and the application/scim+json content type, /ServiceProviderConfig, /ResourceTypes and /Schemas, and parses
filters (scim2-filter-parser). What it leaves to the site is here: who may call (a bearer token of the SCIM scope,
SCIMTokenAuth), how our models read and write (the adapters below), and what a write means for access — every
write goes through apps/sso/provisioning.py, whose services audit it:

- `active: false` (PATCH or PUT) or DELETE ends the person's sessions and revokes their API tokens at once
  (user_deactivate). DELETE keeps the user row (their runs, labels and audit rows keep their author) and answers
  404 for that id from then on, as RFC 7644 section 3.6 asks.
- Each SCIM token belongs to one identity provider (`manage.py scim_token create --provider <id>`), and sees and
  writes only that provider's people and groups (scim_queries.scim_users): those it provisioned and those who
  signed on through it. The people it creates are recorded as its own (ScimUser.provider, with their externalId),
  and their first login through that provider is linked to them (services.sso_login_admit), so a deactivation here
  reaches the account they log in with. A group's members feed the same provider's roles-from-groups mappings as
  its logins' claims do.

Superusers and local accounts are not SCIM resources: the identity provider cannot see, change or deactivate the
operator accounts (the break-glass one included), nor take over an account someone made in the studio. What the
identity provider sends as a password is never stored: its people sign in through the identity provider.
"""

from __future__ import annotations

import uuid

from django.contrib.auth import get_user_model
from django.core import validators
from django.core.exceptions import ValidationError
from django_scim import constants, exceptions
from django_scim import views as scim_views
from django_scim.adapters import SCIMGroup, SCIMUser
from django_scim.models import SCIMServiceProviderConfig

from . import provisioning
from .scim_models import ScimGroup, ScimUser
from .scim_queries import scim_provider, scim_users

User = get_user_model()

# What `active` may arrive as: Entra ID sends the strings "True" and "False" (its documented deviation).
ACTIVE_STRINGS = {"true": True, "false": False}


def _active(value) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ACTIVE_STRINGS:
        return ACTIVE_STRINGS[value.strip().lower()]
    raise exceptions.BadRequestError(f'"active" must be true or false, not {value!r}.', scim_type="invalidValue")


def _text(value, name: str) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise exceptions.BadRequestError(f'"{name}" must be a string.', scim_type="invalidValue")
    return value.strip()


def _primary_email(value) -> str:
    """The primary address of a SCIM `emails` value (else the first; a bare dict as OneLogin sends), validated."""
    if isinstance(value, dict):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(e, dict) for e in value):
        raise exceptions.BadRequestError('"emails" must be a list of {"value": ..., "primary": ...}.',
                                         scim_type="invalidValue")
    ordered = sorted(value, key=lambda e: not e.get("primary"))
    email = _text(ordered[0].get("value"), "emails.value") if ordered else ""
    if email:
        try:
            validators.validate_email(email)
        except ValidationError:
            raise exceptions.BadRequestError(f"{email!r} is not an email address.", scim_type="invalidValue")
    return email


class StudioScimUser(SCIMUser):
    """A studio user as a SCIM User: id is the user's primary key; userName, name, emails, active, externalId (kept
    on ScimUser) and the SCIM groups the person is in. A write collects what it asks for in `changes`, which
    save() hands to provisioning.scim_user_write in one go."""

    id_field = "pk"
    ATTR_MAP = {}  # paths are read by name (handle_replace), never mapped to columns

    def __init__(self, obj, request=None):
        super().__init__(obj, request=request)
        self.changes: dict = {}

    def to_dict(self):
        scim = ScimUser.objects.filter(user_id=self.obj.pk).first()
        return {
            "schemas": [constants.SchemaURI.USER],
            "id": self.id,
            "externalId": scim.external_id if scim else "",
            "userName": self.obj.username,
            "name": {"givenName": self.obj.first_name, "familyName": self.obj.last_name,
                     "formatted": self.display_name},
            "displayName": self.display_name,
            "emails": [{"value": self.obj.email, "primary": True}] if self.obj.email else [],
            "active": self.obj.is_active,
            "groups": [{"value": str(group.scim_id), "display": group.display_name,
                        "$ref": StudioScimGroup(group, self.request).location}
                       for group in self.obj.scim_groups.filter(provider=scim_provider(self.request))
                       .order_by("display_name")],
            "meta": {"resourceType": self.resource_type, "created": self.obj.date_joined.isoformat(),
                     "lastModified": (scim.updated_at if scim else self.obj.date_joined).isoformat(),
                     "location": self.location},
        }

    def validate_dict(self, d):
        if not isinstance(d, dict):
            raise exceptions.BadRequestError("The body must be a SCIM User object.", scim_type="invalidSyntax")

    def from_dict(self, d):
        """A POST's or PUT's whole resource. What it leaves out keeps its value: an omitted `active` is not a
        deactivation. A password is never kept: these people sign in through the identity provider."""
        self.changes["userName"] = _text(d.get("userName"), "userName")
        if not self.changes["userName"]:
            raise exceptions.BadRequestError('"userName" is required.', scim_type="invalidValue")
        name = d.get("name") or {}
        if not isinstance(name, dict):
            raise exceptions.BadRequestError('"name" must be an object.', scim_type="invalidValue")
        for key in ("givenName", "familyName"):
            if key in name:
                self.changes[key] = _text(name[key], f"name.{key}")
        if "emails" in d:
            self.changes["email"] = _primary_email(d["emails"])
        if "externalId" in d:
            self.changes["externalId"] = _text(d["externalId"], "externalId")
        if "active" in d:
            self.changes["active"] = _active(d["active"])

    def parse_path_and_values(self, path, value):
        # Entra ID sends {"op": "Replace", "path": "active", "value": "False"}; Okta {"op": "replace", "value":
        # {"active": false}}: both become (active, False).
        pairs = super().parse_path_and_values(path, value)
        return [(p, _active(v)) if p.first_path[0] == "active" else (p, v) for p, v in pairs]

    def validate_op_replace(self, path, value, operation):
        pass  # each value is checked where it is applied (handle_replace)

    validate_op_add = validate_op_remove = validate_op_replace

    def handle_replace(self, path, value, operation):
        attr, sub_attr, _ = path.first_path
        if attr == "active":
            self.changes["active"] = value
        elif attr == "userName":
            self.changes["userName"] = _text(value, "userName")
            if not self.changes["userName"]:
                raise exceptions.BadRequestError('"userName" must not be empty.', scim_type="invalidValue")
        elif attr == "name" and sub_attr in ("givenName", "familyName"):
            self.changes[sub_attr] = _text(value, f"name.{sub_attr}")
        elif attr == "name" and sub_attr is None:
            if not isinstance(value, dict):
                raise exceptions.BadRequestError('"name" must be an object.', scim_type="invalidValue")
            for key in ("givenName", "familyName"):
                if key in value:
                    self.changes[key] = _text(value[key], f"name.{key}")
        elif attr == "emails":
            # `emails[type eq "work"].value` (Entra ID) carries the address itself.
            self.changes["email"] = _primary_email(value if not path.is_complex else {"value": value})
        elif attr == "externalId":
            self.changes["externalId"] = _text(value, "externalId")
        # Whatever else the User schema has (displayName, phoneNumbers, title, the enterprise extension) the studio
        # does not keep: accepted and dropped, so that the identity provider's sync goes on.

    handle_add = handle_replace

    def handle_remove(self, path, value, operation):
        attr, sub_attr, _ = path.first_path
        if attr == "externalId":
            self.changes["externalId"] = ""
        elif attr == "name":
            for key in (sub_attr,) if sub_attr in ("givenName", "familyName") else ("givenName", "familyName"):
                self.changes[key] = ""

    def handle_operations(self, operations):
        super().handle_operations(_checked_operations(operations))
        self.save()

    def save(self):
        try:
            self.obj = provisioning.scim_user_write(user=self.obj if self.obj.pk else None, changes=self.changes,
                                                    actor=self.request.user, provider=scim_provider(self.request))
        except provisioning.ProvisioningConflict as exc:
            raise exceptions.IntegrityError(str(exc), scim_type="uniqueness")

    def delete(self):
        provisioning.scim_user_delete(user=self.obj, actor=self.request.user, provider=scim_provider(self.request))


class StudioScimGroup(SCIMGroup):
    """A ScimGroup as a SCIM Group: id is its scim_id (a UUID), displayName its name, members studio users (by
    their SCIM id)."""

    id_field = "scim_id"
    ATTR_MAP = {("members", "value", None): "members.value", ("members", None, None): "members"}

    def __init__(self, obj, request=None):
        super().__init__(obj, request=request)
        self.changes: dict = {}

    @property
    def display_name(self):
        return self.obj.display_name

    def to_dict(self):
        members = self.obj.members.order_by("pk") if self.obj.pk else []
        return {
            "schemas": [constants.SchemaURI.GROUP],
            "id": self.id,
            "externalId": self.obj.external_id,
            "displayName": self.obj.display_name,
            "members": [{"value": str(user.pk), "display": user.username,
                         "$ref": StudioScimUser(user, self.request).location} for user in members],
            "meta": {"resourceType": self.resource_type, "created": self.obj.created_at.isoformat(),
                     "lastModified": self.obj.updated_at.isoformat(), "location": self.location},
        }

    def validate_dict(self, d):
        if not isinstance(d, dict):
            raise exceptions.BadRequestError("The body must be a SCIM Group object.", scim_type="invalidSyntax")

    def from_dict(self, d):
        self.changes["displayName"] = _text(d.get("displayName"), "displayName")
        if not self.changes["displayName"]:
            raise exceptions.BadRequestError('"displayName" is required.', scim_type="invalidValue")
        if "externalId" in d:
            self.changes["externalId"] = _text(d["externalId"], "externalId")
        self.changes["members"] = _member_ids(d.get("members") or [], request=self.request)

    def validate_op_replace(self, path, value, operation):
        pass

    validate_op_add = validate_op_remove = validate_op_replace

    def _members(self) -> set[int]:
        if "members" not in self.changes:
            self.changes["members"] = set(self.obj.members.values_list("pk", flat=True))
        return self.changes["members"]

    def handle_add(self, path, value, operation):
        if path.first_path[0] == "members":
            self._members().update(_member_ids(value or [], request=self.request))
        else:
            self.handle_replace(path, value, operation)

    def handle_replace(self, path, value, operation):
        attr = path.first_path[0]
        if attr == "members":
            self.changes["members"] = _member_ids(value or [], request=self.request)
        elif attr == "displayName":
            self.changes["displayName"] = _text(value, "displayName")
            if not self.changes["displayName"]:
                raise exceptions.BadRequestError('"displayName" must not be empty.', scim_type="invalidValue")
        elif attr == "externalId":
            self.changes["externalId"] = _text(value, "externalId")
        # `id` (Okta sends it beside displayName) and anything else: nothing to keep.

    def handle_remove(self, path, value, operation):
        if path.first_path[0] != "members":
            return
        members = self._members()
        if path.is_complex:
            # members[value eq "42"] (Okta, Entra ID): the filter names whom to remove.
            named = [param for attr_path, param in zip(path, path.transpiler.params.values(), strict=False)
                     if tuple(attr_path) == ("members", "value", None)]
            members.difference_update(int(v) for v in named if str(v).isdigit())
        elif value:
            members.difference_update(_member_ids(value, request=self.request))
        else:
            members.clear()

    def handle_operations(self, operations):
        super().handle_operations(_checked_operations(operations))
        self.save()

    def save(self):
        try:
            self.obj = provisioning.scim_group_write(group=self.obj if self.obj.pk else None, changes=self.changes,
                                                     actor=self.request.user, provider=scim_provider(self.request))
        except provisioning.ProvisioningConflict as exc:
            raise exceptions.IntegrityError(str(exc), scim_type="uniqueness")

    def delete(self):
        provisioning.scim_group_delete(group=self.obj, actor=self.request.user)


def _checked_operations(operations):
    """A PATCH's Operations as django-scim2 reads them, or a SCIM 400 (it would fail on anything else with a 500)."""
    if not isinstance(operations, list) or not all(isinstance(o, dict) for o in operations):
        raise exceptions.BadRequestError('"Operations" must be a list of {"op", "path", "value"}.',
                                         scim_type="invalidSyntax")
    return operations


def _member_ids(members, *, request) -> set[int]:
    """The user ids a `members` value names, each a user the token's provider sees (400 otherwise)."""
    if not isinstance(members, list) or not all(isinstance(m, dict) for m in members):
        raise exceptions.BadRequestError('"members" must be a list of {"value": "<user id>"}.',
                                         scim_type="invalidValue")
    values = [str(member.get("value", "")) for member in members]
    ids = {int(v) for v in values if v.isdigit()}
    found = set(scim_users(provider=scim_provider(request)).filter(pk__in=ids).values_list("pk", flat=True))
    missing = [v for v in values if not v.isdigit() or int(v) not in found]
    if missing:
        raise exceptions.BadRequestError(f"No user {', '.join(missing)}: a member's value is the id of a user "
                                         "/scim/v2/Users lists.", scim_type="invalidValue")
    return ids


class ServiceProviderConfig(SCIMServiceProviderConfig):
    def to_dict(self):
        d = super().to_dict()
        d["filter"] = {"supported": True, "maxResults": 50}
        d["changePassword"] = {"supported": False}  # people sign in through the identity provider
        d["bulk"] = {"supported": False, "maxOperations": 0, "maxPayloadSize": 0}
        return d


class UsersView(scim_views.UsersView):
    def get_object(self):
        # A user's id is a primary key: anything else is a SCIM 404, not a database error.
        if not str(self.kwargs.get("uuid", "")).isdigit():
            raise exceptions.NotFoundError(self.kwargs.get("uuid"))
        return super().get_object()

    def post(self, request, *args, **kwargs):
        body = self.load_body(request.body)
        name = body.get("userName") if isinstance(body, dict) else None
        if isinstance(name, str) and User.objects.filter(username=name.strip()).exists():
            if scim_users(provider=scim_provider(request)).filter(username=name.strip()).exists():
                raise exceptions.IntegrityError(f"A user named {name.strip()!r} exists: find its id with "
                                                f'filter=userName eq "{name.strip()}".', scim_type="uniqueness")
            raise exceptions.IntegrityError(
                f"The studio has an account named {name.strip()!r} that this identity provider does not manage (made "
                "in the studio, or another provider's): it is not taken over. An administrator can rename one of "
                "the two.", scim_type="uniqueness")
        return super().post(request, *args, **kwargs)


class GroupsView(scim_views.GroupsView):
    def get_object(self):
        try:
            uuid.UUID(str(self.kwargs.get("uuid")))
        except ValueError:
            raise exceptions.NotFoundError(self.kwargs.get("uuid"))
        return super().get_object()

    def post(self, request, *args, **kwargs):
        body = self.load_body(request.body)
        name = body.get("displayName") if isinstance(body, dict) else None
        if isinstance(name, str) and ScimGroup.objects.filter(provider=scim_provider(request),
                                                               display_name=name.strip()).exists():
            raise exceptions.IntegrityError(f"A group named {name.strip()!r} exists: find its id with "
                                            f'filter=displayName eq "{name.strip()}".', scim_type="uniqueness")
        return super().post(request, *args, **kwargs)

"""What SCIM provisioning keeps beyond django.contrib.auth's users (apps/sso/scim.py): the identity provider's
groups and their members, and per person the provider's externalId and whether the provider deleted them.
Imported by models.py, where Django looks for the app's models."""

import uuid

from django.conf import settings
from django.db import models


class ScimGroup(models.Model):
    """A group the identity provider `provider` pushed over SCIM (with the SCIM token that provider holds). Its
    display name, and its externalId (Entra ID sends the group's object id there, the id its groups claim carries),
    are groups of that provider for the GroupRoleMappings: its members' roles follow it as a login's groups claim
    does, under the same mappings."""

    scim_id = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    provider = models.CharField(max_length=63, default="")
    display_name = models.CharField(max_length=255)
    external_id = models.CharField(max_length=255, blank=True, default="")
    members = models.ManyToManyField(settings.AUTH_USER_MODEL, related_name="scim_groups", blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["provider", "display_name"],
                                               name="one_scim_group_name_per_provider")]

    def __str__(self) -> str:
        return self.display_name


class ScimUser(models.Model):
    """A person as the identity provider's SCIM client knows them: the provider that provisioned them (the SCIM
    token's), its externalId, and `deleted_at` once it deleted them (RFC 7644 section 3.6: that id answers 404 from
    then on). Their SCIM userName is the user's username. Their first login through `provider` is linked to this
    user (services.sso_login_admit), never through another provider. The user row itself stays, deactivated: their
    runs, review labels and audit rows keep their author."""

    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="scim")
    provider = models.CharField(max_length=63, default="")
    external_id = models.CharField(max_length=255, blank=True, default="")
    deleted_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

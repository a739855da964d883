"""Enterprise sign-on: which identity-provider group gives which role in a project.

The people themselves are django.contrib.auth users linked to their provider's subject by allauth's SocialAccount;
a role a mapping granted is an accounts.Membership whose `granted_by` names the provider.
"""

from django.db import models

from apps.accounts.models import Project, Role


class GroupRoleMapping(models.Model):
    """Members of `group` at the provider `provider` (its id in STUDIO_OIDC_PROVIDERS or STUDIO_SAML_PROVIDERS)
    hold `role` in `project`; the highest role any of a person's groups maps to wins, recomputed at every login."""

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="group_role_mappings")
    provider = models.CharField(max_length=63)
    # As the provider spells it in the groups claim: a name ("ml-team"), a path ("/acme/ml") or an id (Entra ID's
    # object ids). Compared exactly.
    group = models.CharField(max_length=255)
    role = models.CharField(max_length=16, choices=Role.choices)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["project", "provider", "group"],
                                               name="one_role_per_project_provider_group")]

    def __str__(self) -> str:
        return f"{self.provider}:{self.group} -> {self.role} in {self.project_id}"


class SamlAssertion(models.Model):
    """A SAML assertion a login was made with, kept until it expires so that it is never accepted again
    (apps/sso/saml.py: python3-saml and allauth remember none)."""

    provider = models.CharField(max_length=63)
    assertion_id = models.CharField(max_length=255, unique=True)
    keep_until = models.DateTimeField(db_index=True)

# SCIM provisioning's models live in scim_models.py (S2); imported here, where Django looks for them.
from .scim_models import ScimGroup, ScimUser  # noqa: E402,F401

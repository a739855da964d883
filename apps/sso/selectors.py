"""Reads for sign-on: the configured identity providers, a project's group mappings and members."""

from django.conf import settings
from django.db.models import QuerySet

from apps.accounts.models import Membership, Project

from .models import GroupRoleMapping


def sign_on_providers() -> dict[str, dict]:
    """provider id -> {"name", "protocol", "groups_claim"}: every identity provider the operator configured
    (settings.SIGN_ON_PROVIDERS, from STUDIO_OIDC_PROVIDERS and STUDIO_SAML_PROVIDERS)."""
    return settings.SIGN_ON_PROVIDERS


def mapping_list(*, project: Project) -> QuerySet[GroupRoleMapping]:
    return GroupRoleMapping.objects.filter(project=project).order_by("provider", "group")


def member_list(*, project: Project) -> QuerySet[Membership]:
    return Membership.objects.filter(project=project).select_related("user").order_by("user__username")

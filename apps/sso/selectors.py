"""Reads for sign-on: the configured identity providers, a project's group mappings and members, and the groups a
provider last told the studio a person is in."""

from allauth.socialaccount.models import SocialAccount
from django.conf import settings
from django.db.models import QuerySet

from apps.accounts.models import Membership, Project

from .models import GroupRoleMapping, ScimGroup

# The claim compared with a SCIM userName when a provider's configuration names none (settings: _SCIM_MATCH).
SCIM_MATCH_DEFAULT = {"oidc": "email", "saml": "nameid"}


def sign_on_providers() -> dict[str, dict]:
    """provider id -> {"name", "protocol", "groups_claim", "scim_match"}: every identity provider the operator
    configured (settings.SIGN_ON_PROVIDERS, from STUDIO_OIDC_PROVIDERS and STUDIO_SAML_PROVIDERS)."""
    return settings.SIGN_ON_PROVIDERS


def scim_match_claim(provider: str) -> str:
    """The claim (OpenID Connect) or attribute (SAML; "nameid": the NameID) of `provider`'s logins that is compared
    with the SCIM userName of the people its SCIM token provisioned."""
    config = sign_on_providers().get(provider, {})
    return config.get("scim_match") or SCIM_MATCH_DEFAULT.get(config.get("protocol"), "email")


def login_claims(extra_data: dict) -> dict:
    """One dict of the person's claims: an OpenID login's verified ID token over its UserInfo (the two are about
    one subject: oidc/views.py checked it); another protocol's attributes as they are."""
    if "id_token" in extra_data or "userinfo" in extra_data:
        return {**(extra_data.get("userinfo") or {}), **(extra_data.get("id_token") or {})}
    return dict(extra_data)


def last_login_claims(*, user, provider: str) -> dict:
    """The claims of `user`'s last login through `provider` (allauth keeps them on the SocialAccount); {} if none."""
    account = SocialAccount.objects.filter(user=user, provider=provider).only("extra_data").first()
    return login_claims(account.extra_data) if account else {}


def scim_groups(*, provider: str, user=None) -> set[str]:
    """The names `provider`'s SCIM groups go by in the mappings (a group's displayName, and its externalId, which
    Entra ID fills with the object id its groups claim carries): of the groups `user` is in, or of all of them."""
    groups = ScimGroup.objects.filter(provider=provider)
    if user is not None:
        groups = groups.filter(members=user)
    return {name for row in groups.values_list("display_name", "external_id") for name in row if name}


def mapping_list(*, project: Project) -> QuerySet[GroupRoleMapping]:
    return GroupRoleMapping.objects.filter(project=project).order_by("provider", "group")


def member_list(*, project: Project) -> QuerySet[Membership]:
    return Membership.objects.filter(project=project).select_related("user").order_by("user__username")

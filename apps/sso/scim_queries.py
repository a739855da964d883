"""Which studio users and groups SCIM sees, for django-scim2's lookups, lists and filters (`userName eq "..."`,
translated to SQL by scim2-filter-parser). Kept apart from scim.py because django-scim2 imports the filter classes
while it defines its adapters (the USER_FILTER_PARSER and GROUP_FILTER_PARSER settings)."""

from allauth.socialaccount.models import SocialAccount
from django.contrib.auth import get_user_model
from django.db.models import Q, QuerySet
from django_scim import exceptions
from django_scim.filters import FilterQuery

from .scim_models import ScimGroup, ScimUser


def scim_users(*, provider: str) -> QuerySet:
    """The users the SCIM token of `provider` sees: the people it provisioned, and those who signed on through it
    (so that a provider whose people logged in before it provisioned them finds them by userName). Not local
    accounts, not another provider's people (an identity provider manages only its own), not superusers (the
    operators, the break-glass account among them, are never an identity provider's to see or deactivate), not
    those the identity provider deleted."""
    return (get_user_model().objects.filter(is_superuser=False)
            .filter(Q(scim__provider=provider) | Q(socialaccount__provider=provider))
            .exclude(scim__deleted_at__isnull=False).distinct())


def scim_provider(request) -> str:
    """The identity provider whose SCIM token made `request` (apps/sso/scim_auth.py checked it)."""
    return request.scim_token.provider


class UserFilterQuery(FilterQuery):
    """Filters on auth_user, over the same users as scim_users."""

    model_getter = get_user_model
    attr_map = {
        ("userName", None, None): "username",
        ("name", "familyName", None): "last_name",
        ("familyName", None, None): "last_name",
        ("name", "givenName", None): "first_name",
        ("givenName", None, None): "first_name",
        ("active", None, None): "is_active",
        ("emails", "value", None): "email",
        ("emails", None, None): "email",
    }

    @classmethod
    def get_extras(cls, q, request=None):
        table, scim, social = cls.table_name(), ScimUser._meta.db_table, SocialAccount._meta.db_table
        return (f" AND NOT {table}.is_superuser"
                f" AND {table}.id IN (SELECT user_id FROM {scim} WHERE provider = %s"
                f" UNION SELECT user_id FROM {social} WHERE provider = %s)"
                f" AND {table}.id NOT IN (SELECT user_id FROM {scim} WHERE deleted_at IS NOT NULL)",
                [scim_provider(request)] * 2)


def _group_model():
    return ScimGroup


class GroupFilterQuery(FilterQuery):
    """Filters on the SCIM groups of the token's provider."""

    model_getter = _group_model
    attr_map = {("displayName", None, None): "display_name", ("externalId", None, None): "external_id"}

    @classmethod
    def get_extras(cls, q, request=None):
        return f" AND {cls.table_name()}.provider = %s", [scim_provider(request)]


def object_post_processor_getter(model):
    """A user or group the token's provider does not see is as absent as one that does not exist."""
    def post_process(request, obj, *args, **kwargs):
        provider = scim_provider(request)
        visible = (scim_users(provider=provider).filter(pk=obj.pk).exists() if model is get_user_model()
                   else obj.provider == provider)
        if not visible:
            raise exceptions.NotFoundError(obj.pk if model is get_user_model() else obj.scim_id)
        return obj
    return post_process


def queryset_post_processor_getter(model):
    def post_process(request, qs, *args, **kwargs):
        provider = scim_provider(request)
        if model is get_user_model():
            return qs.filter(pk__in=scim_users(provider=provider).values("pk"))
        return qs.filter(provider=provider)
    return post_process

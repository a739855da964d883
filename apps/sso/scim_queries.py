"""Which studio users and groups SCIM sees, for django-scim2's lookups, lists and filters (`userName eq "..."`,
translated to SQL by scim2-filter-parser). Kept apart from scim.py because django-scim2 imports the filter classes
while it defines its adapters (the USER_FILTER_PARSER and GROUP_FILTER_PARSER settings)."""

from django.contrib.auth import get_user_model
from django.db.models import QuerySet
from django_scim import exceptions
from django_scim.filters import FilterQuery

from .scim_models import ScimGroup, ScimUser


def scim_users() -> QuerySet:
    """The users SCIM sees: not superusers (the operators, the break-glass account among them: the identity
    provider can neither see nor deactivate them), not those the identity provider deleted."""
    return get_user_model().objects.filter(is_superuser=False).exclude(scim__deleted_at__isnull=False)


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
        table = cls.table_name()
        return (f" AND NOT {table}.is_superuser AND {table}.id NOT IN "
                f"(SELECT user_id FROM {ScimUser._meta.db_table} WHERE deleted_at IS NOT NULL)", [])


def _group_model():
    return ScimGroup


class GroupFilterQuery(FilterQuery):
    model_getter = _group_model
    attr_map = {("displayName", None, None): "display_name", ("externalId", None, None): "external_id"}


def object_post_processor_getter(model):
    """A user SCIM does not see is as absent as one that does not exist."""
    def post_process(request, obj, *args, **kwargs):
        if model is get_user_model() and not scim_users().filter(pk=obj.pk).exists():
            raise exceptions.NotFoundError(obj.pk)
        return obj
    return post_process


def queryset_post_processor_getter(model):
    def post_process(request, qs, *args, **kwargs):
        return qs.filter(pk__in=scim_users()) if model is get_user_model() else qs
    return post_process

"""Roles from an identity provider's groups (apps/sso/services.py): who is admitted, which role each project gives,
what a login changes and how each change is audited."""

import pytest
from allauth.socialaccount.models import SocialAccount
from django.contrib.auth import get_user_model

from apps.accounts.models import AuditEvent, Membership, Role
from apps.accounts.services import membership_set, project_create
from apps.common.errors import StudioError
from apps.sso.models import GroupRoleMapping
from apps.sso.services import SsoRefused, mapping_delete, mapping_set, sso_login_admit

from .conftest import PROVIDER

User = get_user_model()


def claims(groups, sub="00u-ada", **more):
    return {"sub": sub, "preferred_username": "ada", "email": "ada@example.com", "groups": groups, **more}


def role_in(project, user):
    return Membership.objects.filter(project=project, user=user).values_list("role", "granted_by").first()


@pytest.fixture
def mapped(sign_on, project, owner):
    mapping_set(project=project, provider=PROVIDER, group="ml-team", role=Role.EDITOR, actor=owner)
    mapping_set(project=project, provider=PROVIDER, group="ml-leads", role=Role.OWNER, actor=owner)
    mapping_set(project=project, provider=PROVIDER, group="everyone", role=Role.VIEWER, actor=owner)
    return project


def test_an_unmapped_person_is_refused_and_no_account_is_made(mapped):
    with pytest.raises(SsoRefused, match="sales, support.*No project here gives any of them a role"):
        sso_login_admit(provider=PROVIDER, claims=claims(["sales", "support"]))
    assert not User.objects.filter(username="ada").exists()
    assert not SocialAccount.objects.exists()


def test_a_mapped_person_gets_an_account_and_the_highest_mapped_role(mapped):
    user = sso_login_admit(provider=PROVIDER, claims=claims(["everyone", "ml-team", "sales"]))
    assert user.username == "ada" and not user.has_usable_password()
    assert role_in(mapped, user) == (Role.EDITOR, PROVIDER)
    grant = AuditEvent.objects.get(action="membership.sso_grant")
    assert grant.target == "user/ada" and grant.via == "sso" and grant.actor is None
    assert grant.details == {"provider": PROVIDER, "claim": "groups", "groups": ["ml-team"], "from_role": None,
                             "to_role": Role.EDITOR}
    assert sso_login_admit(provider=PROVIDER, claims=claims(["everyone", "ml-team"])) == user  # same subject


def test_roles_follow_the_groups_at_each_login(mapped):
    user = sso_login_admit(provider=PROVIDER, claims=claims(["ml-team"]))
    sso_login_admit(provider=PROVIDER, claims=claims(["ml-leads"]))
    assert role_in(mapped, user) == (Role.OWNER, PROVIDER)
    change = AuditEvent.objects.get(action="membership.sso_change")
    assert (change.details["from_role"], change.details["to_role"], change.details["groups"]) == (
        Role.EDITOR, Role.OWNER, ["ml-leads"])
    with pytest.raises(SsoRefused):
        sso_login_admit(provider=PROVIDER, claims=claims(["sales"]))
    assert role_in(mapped, user) is None  # removed, and the removal stays although the login was refused
    assert AuditEvent.objects.get(action="membership.sso_remove").details["from_role"] == Role.OWNER


def test_a_role_granted_by_hand_is_never_touched(mapped, owner, make_user):
    other = project_create(team_slug="acme", slug="acme-evals", name="Evals", owner=owner)
    user = sso_login_admit(provider=PROVIDER, claims=claims(["everyone"]))
    membership_set(project=mapped, user=user, role=Role.REVIEWER, actor=owner)  # by hand, over the mapped viewer
    membership_set(project=other, user=user, role=Role.VIEWER, actor=owner)
    assert sso_login_admit(provider=PROVIDER, claims=claims(["ml-leads"])) == user
    assert role_in(mapped, user) == (Role.REVIEWER, "")
    # No group maps anymore, but a role granted by hand elsewhere still admits them.
    assert sso_login_admit(provider=PROVIDER, claims=claims([])) == user
    assert role_in(other, user) == (Role.VIEWER, "")


def test_a_local_account_of_the_same_name_is_not_taken_over(mapped, make_user):
    local = make_user("ada")
    user = sso_login_admit(provider=PROVIDER, claims=claims(["ml-team"]))
    assert user != local and user.username == f"ada-{PROVIDER}"
    assert role_in(mapped, local) is None


def test_a_deactivated_account_is_refused(mapped):
    user = sso_login_admit(provider=PROVIDER, claims=claims(["ml-team"]))
    User.objects.filter(pk=user.pk).update(is_active=False)
    with pytest.raises(SsoRefused, match="deactivated"):
        sso_login_admit(provider=PROVIDER, claims=claims(["ml-team"]))


def test_a_login_without_subject_is_refused(mapped):
    with pytest.raises(SsoRefused, match="no subject"):
        sso_login_admit(provider=PROVIDER, claims=claims(["ml-team"], sub=""))


def test_a_single_string_claim_counts_as_one_group(mapped, owner, settings):
    # Google's ID token has no groups: its `hd` (the Workspace domain) can be mapped instead.
    mapping_set(project=mapped, provider=PROVIDER, group="example.com", role=Role.VIEWER, actor=owner)
    user = sso_login_admit(provider=PROVIDER, claims={"sub": "g-1", "hd": "example.com"}, groups_claim="hd")
    assert role_in(mapped, user) == (Role.VIEWER, PROVIDER)


def test_only_owners_map_groups_and_each_change_is_audited(mapped, member, owner):
    editor = member(Role.EDITOR)
    with pytest.raises(StudioError, match="Only an owner"):
        mapping_set(project=mapped, provider=PROVIDER, group="x", role=Role.OWNER, actor=editor)
    with pytest.raises(StudioError, match="No identity provider 'okta'"):
        mapping_set(project=mapped, provider="okta", group="x", role=Role.VIEWER, actor=owner)
    with pytest.raises(StudioError, match="Name the group"):
        mapping_set(project=mapped, provider=PROVIDER, group=" ", role=Role.VIEWER, actor=owner)
    mapping = mapping_set(project=mapped, provider=PROVIDER, group="ml-team", role=Role.REVIEWER, actor=owner)
    assert GroupRoleMapping.objects.get(pk=mapping.pk).role == Role.REVIEWER
    mapping_delete(mapping=mapping, actor=owner)
    actions = list(AuditEvent.objects.filter(action__startswith="sso_mapping").values_list("action", flat=True))
    assert actions.count("sso_mapping.set") == 4 and actions.count("sso_mapping.delete") == 1

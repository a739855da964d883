from django.urls import reverse

from apps.accounts.models import Role


def test_owner_sees_every_write_newest_first(login, owner, project, registry):
    page = login(owner).get(reverse("audit_log", kwargs={"project": project.slug}))
    assert page.status_code == 200
    events = list(page.context["events"])
    assert events[0].target == "bundle/arith-bundle@1" and events[0].action == "version.publish"
    assert b"verifier/numeric@1" in page.content and b"project.create" in page.content


def test_only_owners_read_the_audit_log(login, member, outsider, project, registry):
    url = reverse("audit_log", kwargs={"project": project.slug})
    assert login(member(Role.EDITOR)).get(url).status_code == 403
    assert login(outsider).get(url).status_code == 404

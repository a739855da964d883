import re

from django.urls import reverse

from apps.accounts.models import Role
from apps.accounts.services import audit_record


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


def test_details_named_like_a_dicts_methods_are_shown_as_written(login, owner, project, registry):
    # A review queue's creation records how many items it drew as "items": the page must list the details, not
    # read that key as the dict's items() (Django's lookup tries the key first).
    audit_record(project=project, actor=owner, action="review.queue.create", target="queue/spot-checks",
                 details={"rubric": "rubric/correctness@1", "items": 15, "keys": ["a"], "values": None})
    page = login(owner).get(reverse("audit_log", kwargs={"project": project.slug}))
    assert page.status_code == 200
    # PostgreSQL's jsonb keeps keys in its own order (shortest first), SQLite as written: the cell, in any order.
    cell = re.search(r"<td class=\"muted\">([^<]*items=[^<]*)</td>", page.content.decode()).group(1)
    assert sorted(cell.split(", ")) == ["items=15", "keys=[&#x27;a&#x27;]", "rubric=rubric/correctness@1",
                                        "values=None"]

"""A label written in the browser is stored with "\n" line endings, as every text entering the studio is: a
browser submits a textarea's lines with "\r\n" (the free-text answer and the comment here)."""

from django.urls import reverse

from apps.review.models import Label
from apps.review.services import item_next, queue_create


def test_a_labels_text_from_the_browser_is_stored_with_newlines(client, project, archive, rubric, owner, member):
    reviewer = member("reviewer")
    queue = queue_create(project=project, slug="endings", rubric=rubric, actor=owner, reviewers=[reviewer],
                         sampling={"rule": "random", "n": 1}, overlap=1, blind=False)
    item = item_next(queue=queue, reviewer=reviewer)
    client.force_login(reviewer)
    page = reverse("review:item", kwargs={"project": project.slug, "queue": queue.slug, "item_id": item.pk})
    answered = client.post(page, {"action": "label", "a-verdict": "correct", "a-notes": "first line\r\nsecond",
                                  "comment": "looked at\r\nboth turns\r"})
    assert answered.status_code in (200, 302)
    label = Label.objects.get(item=item, reviewer=reviewer)
    assert label.answers["notes"] == "first line\nsecond"
    assert label.comment == "looked at\nboth turns\n"

"""A rubric's question keys are its author's: one named like a dict's method (items, values, keys) shows on the
queue page and the item page as the answer it names, never read as the answers' own items() (Django's template
lookup tries the key first)."""

from django.urls import reverse

from apps.registry.services import version_publish
from apps.review.services import adjudicate, item_next, label_submit, queue_create

RUBRIC = {"questions": [
    {"key": "items", "type": "labels", "prompt": "Are the listed items right?", "labels": ["right", "wrong"]},
    {"key": "values", "type": "pass_fail", "prompt": "Are the values in range?"},
]}


def test_answers_to_questions_named_like_dict_methods_are_shown(client, project, archive, owner, member):
    rubric = version_publish(project=project, kind="rubric", slug="lists", spec=RUBRIC, author=owner).version
    first, second = member("reviewer"), member("editor")
    queue = queue_create(project=project, slug="lists", rubric=rubric, actor=owner, reviewers=[first, second],
                         sampling={"rule": "random", "n": 1}, overlap=2, blind=False)
    item = item_next(queue=queue, reviewer=first)
    assert item_next(queue=queue, reviewer=second) == item
    label_submit(queue=queue, item_id=item.pk, reviewer=first, answers={"items": "right", "values": True})
    label_submit(queue=queue, item_id=item.pk, reviewer=second, answers={"items": "wrong", "values": True})
    adjudicate(queue=queue, item_id=item.pk, question="items", answer="wrong", adjudicator=owner)

    client.force_login(owner)
    where = {"project": project.slug, "queue": queue.slug}
    queue_page = client.get(reverse("review:queue", kwargs=where))
    assert queue_page.status_code == 200
    disputes = queue_page.content.decode()
    assert "items=right values=True" in disputes and "items=wrong values=True" in disputes
    assert "<b>items=wrong</b>" in disputes
    item_page = client.get(reverse("review:item", kwargs={**where, "item_id": item.pk}))
    assert item_page.status_code == 200
    assert "items=right values=True" in item_page.content.decode()

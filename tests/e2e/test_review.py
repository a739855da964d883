"""The review page in a real browser: a reviewer labels from the keyboard (a label, an ordinal answer, one
turn), a blind queue hides the first reviewer's label from the second until theirs is in, and the queue page
shows Krippendorff's alpha with its interval once two reviewers overlap."""

import pytest

from apps.registry.services import version_publish
from apps.review.models import Label
from apps.review.services import item_next, label_submit, queue_create
from tests.support.specimens import RUBRIC

pytestmark = pytest.mark.browser


def ready(page):
    """The review page with its scripts running: a question highlighted, the replay on a turn."""
    page.wait_for_selector("[data-label-form] .question.active")
    page.wait_for_selector(".turn.current")


def test_keyboard_labelling_blind_review_and_agreement(page_as, live_url, project, owner, member, studio_run):
    ann, bob = member("reviewer"), member("editor")
    rubric = version_publish(project=project, kind="rubric", slug="correctness", spec=RUBRIC, author=owner).version
    queue = queue_create(project=project, slug="check", rubric=rubric, actor=owner, overlap=2, blind=True,
                         reviewers=[ann, bob], sampling={"rule": "random", "n": 6})
    base = f"{live_url}/p/{project.slug}/review/check/"

    page = page_as(ann)
    page.goto(base)
    page.click("[data-start]")
    ready(page)
    first_item = int(page.url.split("#")[0].rstrip("/").split("/")[-1])
    page.keyboard.press("1")  # verdict: correct; the highlight moves on to quality
    page.keyboard.press("3")  # quality: good
    page.keyboard.press("j")  # the replay's next turn: 1
    page.keyboard.press("t")  # label this turn
    page.check("[data-step-form] input[name=a-step_ok][value=false]")
    page.click("[data-step-submit]")
    ready(page)
    assert page.is_checked("input[name=a-verdict][value=correct]")  # the answers given survive the turn's label
    assert f"/items/{first_item}/" in page.url
    page.keyboard.press("Enter")  # submit the item's label: on to the next item
    page.wait_for_url(lambda url: f"/items/{first_item}/" not in url)
    whole = Label.objects.get(item_id=first_item, reviewer=ann, step__isnull=True)
    assert whole.answers == {"verdict": "correct", "quality": "good"} and whole.rubric == rubric
    assert Label.objects.get(item_id=first_item, reviewer=ann, step=1).answers == {"step_ok": False}

    other = page_as(bob)
    other.goto(base)
    other.click("[data-start]")
    ready(other)
    assert f"/items/{first_item}/" in other.url  # overlap 2: Bob gets Ann's first item too
    labels = other.locator("[data-labels]").inner_text()
    assert "reviewer-user" not in labels and "Blind review" in labels
    other.keyboard.press("2")  # wrong
    other.keyboard.press("Enter")
    other.wait_for_url(lambda url: f"/items/{first_item}/" not in url)
    other.goto(f"{base}items/{first_item}/")
    assert "reviewer-user" in other.locator("[data-labels]").inner_text()  # labelled: the others' labels show

    # Two more items both label, one agreeing and one not: alpha with its interval on the queue page.
    for verdicts in (("correct", "correct"), ("wrong", "wrong"), ("correct", "format")):
        item = item_next(queue=queue, reviewer=ann)
        assert item_next(queue=queue, reviewer=bob) == item
        for reviewer, verdict in ((ann, verdicts[0]), (bob, verdicts[1])):
            label_submit(queue=queue, item_id=item.pk, reviewer=reviewer, answers={"verdict": verdict})
    page.goto(base)
    row = page.locator("[data-agreement] tr[data-question=verdict]")
    alpha = float(row.locator("[data-alpha]").inner_text())
    low, high = (float(x) for x in row.locator("[data-interval]").inner_text().strip("[]").split(","))
    assert -1 <= low <= alpha <= high <= 1
    assert page.locator("[data-disputes] tr[data-item]").count() == 2

"""The review page in a real browser: a reviewer labels from the keyboard (a label, an ordinal answer, one
turn), a blind queue hides the first reviewer's label from the second until theirs is in, and the queue page
shows Krippendorff's alpha with its interval once two reviewers overlap. The keys do what the hint line says and
never overwrite an answer given; a summary is confirmed before submitting; a label is amended as a new revision;
the queue page downloads its dataset export."""

import json
from pathlib import Path

import pytest
from django.urls import reverse

from apps.registry.services import version_publish
from apps.review.models import Label
from apps.review.services import item_next, label_submit, queue_create
from tests.support.specimens import RUBRIC

pytestmark = pytest.mark.browser


def queue_url(project, slug: str) -> str:
    # Reversed here, so the URLconf (and the whole studio behind it) is imported before the browser's first
    # request rather than during it, which on a loaded machine outlasts the page's timeout.
    return reverse("review:queue", kwargs={"project": project.slug, "queue": slug})


def ready(page):
    """The review page with its scripts running: the mark on a question or the summary, the replay on a turn."""
    page.wait_for_selector("[data-label-form] [aria-current=step]")
    page.wait_for_selector(".turn.current")


def test_keyboard_labelling_blind_review_and_agreement(page_as, live_url, project, owner, member, studio_run):
    ann, bob = member("reviewer"), member("editor")
    rubric = version_publish(project=project, kind="rubric", slug="correctness", spec=RUBRIC, author=owner).version
    queue = queue_create(project=project, slug="check", rubric=rubric, actor=owner, overlap=2, blind=True,
                         reviewers=[ann, bob], sampling={"rule": "random", "n": 6})
    base = live_url + queue_url(project, "check")

    page = page_as(ann)
    page.goto(base)
    page.click("[data-start]")
    ready(page)
    first_item = int(page.url.split("#")[0].rstrip("/").split("/")[-1])
    page.keyboard.press("1")  # verdict: correct; the highlight moves on to quality
    page.keyboard.press("3")  # quality: good; every question answered, the mark moves to the summary
    page.keyboard.press("j")  # the replay's next turn: 1
    page.keyboard.press("t")  # label this turn
    page.check("[data-step-form] input[name=a-step_ok][value=false]")
    page.click("[data-step-submit]")
    ready(page)
    assert page.is_checked("input[name=a-verdict][value=correct]")  # the answers given survive the turn's label
    assert f"/items/{first_item}/" in page.url
    page.keyboard.press("Enter")  # the mark is on the summary (all answered): submit, on to the next item
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
    other.keyboard.press("Enter")  # the summary of the answers
    other.keyboard.press("Enter")  # submitted
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


def test_following_the_keys_never_overwrites_an_answer_and_a_summary_comes_before_submit(
        page_as, live_url, project, owner, member, studio_run):
    ann = member("reviewer")
    rubric = version_publish(project=project, kind="rubric", slug="correctness", spec=RUBRIC, author=owner).version
    queue_create(project=project, slug="slips", rubric=rubric, actor=owner, reviewers=[ann],
                 sampling={"rule": "random", "n": 3})
    page = page_as(ann)
    page.goto(live_url + queue_url(project, "slips"))
    page.click("[data-start]")
    ready(page)
    item_url = page.url.split("#")[0]
    hint = page.locator("[data-keys-hint]")

    def marked() -> str:
        """What the mark is on: a question's key, or "summary"."""
        return page.locator("[data-label-form] [aria-current=step]").get_attribute("data-stop")

    # The hint says what each key does from where the mark is, and the marked question is visibly marked.
    assert marked() == "verdict" and page.locator(".question.active legend").is_visible()
    assert "1–5 answer “Is the answer right?”, then the mark moves to “How good is it?”" in hint.inner_text()
    assert "Tab: the mark moves to “How good is it?”" in hint.inner_text()
    assert "Enter: check your answers before submitting" in hint.inner_text()

    page.keyboard.press("1")  # verdict: correct; the mark moves on, as the hint said
    assert marked() == "quality"
    assert "1–3 answer “How good is it?”, then the mark moves to your answers" in hint.inner_text()
    page.keyboard.press("Tab")  # the last question: on to the summary, never back to the answered verdict
    assert marked() == "summary"
    page.keyboard.press("3")  # digits answer nothing on the summary
    assert page.is_checked("input[name=a-verdict][value=correct]")
    assert not page.is_checked("input[name=a-verdict][value=reward-hack]")
    summary = page.locator("[data-summary]")
    assert summary.is_visible()
    assert "Is the answer right? correct" in summary.inner_text()
    assert "How good is it? not answered" in summary.inner_text()
    assert "Enter: submit these answers" in hint.inner_text()

    page.keyboard.press("Escape")  # back to the questions: the first one not answered
    assert marked() == "quality"
    page.keyboard.press("3")  # quality: good; nothing left unanswered, so the mark goes to the summary
    assert marked() == "summary" and "How good is it? good" in summary.inner_text()
    assert not Label.objects.exists()  # nothing is submitted before the summary is confirmed
    page.keyboard.press("Enter")
    page.wait_for_url(lambda url: not url.startswith(item_url))
    first = Label.objects.get(reviewer=ann)
    assert first.answers == {"verdict": "correct", "quality": "good"}

    # A slip noticed after submitting: the next item links back to it, and the label is amended as revision 2.
    page.click("[data-last-label] a")
    page.wait_for_url(lambda url: url.startswith(item_url))
    ready(page)
    assert "revision 1" in page.locator("[data-mine]").inner_text()
    assert page.is_checked("input[name=a-verdict][value=correct]")  # the form holds the current answers
    assert marked() == "verdict"
    page.keyboard.press("2")  # verdict: wrong; quality is answered, so the mark goes to the summary
    assert marked() == "summary" and "Is the answer right? wrong" in summary.inner_text()
    assert "Enter: submit these answers as revision 2" in hint.inner_text()
    page.keyboard.press("Enter")
    page.wait_for_selector("[data-mine]:has-text('revision 2')")
    assert page.url.startswith(item_url)
    latest = Label.objects.get(reviewer=ann, current=True)
    assert (latest.revision, latest.answers, latest.supersedes_id) == (2, {"verdict": "wrong", "quality": "good"},
                                                                         first.pk)
    first.refresh_from_db()
    assert first.answers == {"verdict": "correct", "quality": "good"} and not first.current
    assert "verdict=correct" in page.locator("[data-revisions]").inner_text()  # the earlier revision, kept


def test_the_queue_page_downloads_its_dataset_export(page_as, live_url, project, owner, member, studio_run):
    ann, viewer = member("reviewer"), member("viewer")
    rubric = version_publish(project=project, kind="rubric", slug="correctness", spec=RUBRIC, author=owner).version
    queue = queue_create(project=project, slug="export", rubric=rubric, actor=owner, reviewers=[ann],
                         sampling={"rule": "random", "n": 3})
    for verdict in ("correct", "reward-hack"):
        item = item_next(queue=queue, reviewer=ann)
        label_submit(queue=queue, item_id=item.pk, reviewer=ann, answers={"verdict": verdict})
    page = page_as(viewer)  # the export API reads with a viewer's role
    page.goto(live_url + queue_url(project, "export"))
    form = page.locator("form[data-export]")
    assert form.locator("select[name=question]").input_value() == "verdict"
    assert form.locator("select[name=accept]").input_value() == "correct"
    with page.expect_download() as sft:
        form.locator("button[type=submit]").click()
    download = sft.value
    assert download.suggested_filename == "export-sft.jsonl"
    rows = [json.loads(line) for line in Path(download.path()).read_text().splitlines()]
    assert [row["provenance"]["labels"][0]["answers"] for row in rows] == [{"verdict": "correct"}]
    form.locator("select[name=kind]").select_option("hacks")
    with page.expect_download() as hacks:
        form.locator("button[type=submit]").click()
    assert hacks.value.suggested_filename == "export-hacks.jsonl"
    assert len(Path(hacks.value.path()).read_text().splitlines()) == 1

"""A reviewer labels a repair trajectory "fixed by feedback / guessed / gave up" with a rubric that asks the repair
question: the item shows the loop and what the tool results say, chooses nothing for the reviewer, and the label is
stored as the rubric's answer."""

from django.urls import reverse

from apps.registry.services import version_publish
from apps.review.models import Label
from apps.review.rubrics import REPAIR_QUESTION
from apps.review.services import item_next, queue_create
from apps.runs.services import run_create
from apps.trajectories.services import trajectories_record
from tests.support.repair import FIX, editor, planted, run_tests
from tests.support.specimens import RUBRIC
from workers.rl.types import trajectory_id


def test_a_reviewer_labels_how_a_repair_trajectory_reached_its_fix(client, project, registry, owner, member):
    rubric = version_publish(project=project, kind="rubric", slug="repair-review", author=owner,
                             spec={"questions": [*RUBRIC["questions"], REPAIR_QUESTION]}).version
    run = run_create(project=project, bundle=registry["bundle"], steps=1, actor=owner)
    trajectory = planted(run_tests(1), editor("str_replace", diff=FIX), run_tests(0),
                         id=trajectory_id(str(run.pk), 0, 0), run_id=str(run.pk))
    trajectories_record(run=run, attempt=1, trajectories=[trajectory])
    reviewer = member("reviewer")
    queue = queue_create(project=project, slug="repairs", rubric=rubric, actor=owner, reviewers=[reviewer],
                         sampling={"rule": "random", "n": 1}, overlap=1, blind=True)
    item = item_next(queue=queue, reviewer=reviewer)
    client.force_login(reviewer)
    url = reverse("review:item", kwargs={"project": project.slug, "queue": queue.slug, "item_id": item.pk})

    page = client.get(url).content.decode()
    assert 'data-repair-outcome="fixed_by_feedback"' in page  # the replay's chain, on the item too
    question = page[page.index('data-question="repair"'):]
    question = question[:question.index("</fieldset>")]
    assert 'data-suggested="fixed_by_feedback"' in question
    assert [label in question for label in ('value="fixed_by_feedback"', 'value="guessed"', 'value="gave_up"')] == \
        [True, True, True]
    assert "checked" not in question  # suggested, not chosen: the reviewer's answer is their own

    # The reviewer reads the loop otherwise (its edit did not follow from the failure), and that is what is kept.
    answered = client.post(url, {"action": "label", "a-verdict": "correct", "a-repair": "guessed"})
    assert answered.status_code == 302
    assert Label.objects.get(item=item, reviewer=reviewer).answers == {"verdict": "correct", "repair": "guessed"}
    # An answer that is not one of the outcomes is refused at its question, and nothing more is stored.
    refused = client.post(url, {"action": "amend", "label": str(Label.objects.get(item=item).pk),
                                "a-verdict": "correct", "a-repair": "solved"})
    assert refused.status_code == 400 and "one of fixed_by_feedback, guessed, gave_up" in refused.content.decode()
    assert Label.objects.filter(item=item).count() == 1

"""`manage.py review_queue`: the queue `make demo` draws, once."""

import pytest
from django.core.management import CommandError, call_command

from apps.review.models import ReviewQueue


def test_the_command_draws_a_queue_once_and_names_what_is_wrong(project, archive, rubric, owner, member):
    member("reviewer")
    call_command("review_queue", "first-look", "--rubric", "correctness", "--sample", "stratified:6",
                 "--overlap", "2", "--reviewers", "reviewer-user", "--adjudicators", "olive", "--if-absent")
    queue = ReviewQueue.objects.get(slug="first-look")
    assert queue.items.count() == 6 and queue.overlap == 2 and queue.blind
    assert list(queue.adjudicators.values_list("username", flat=True)) == ["olive"]
    call_command("review_queue", "first-look", "--rubric", "correctness", "--if-absent")
    assert ReviewQueue.objects.count() == 1
    with pytest.raises(CommandError, match="write RULE:N"):
        call_command("review_queue", "other", "--rubric", "correctness", "--sample", "random")
    with pytest.raises(CommandError, match="No rubric named 'nope'|nope"):
        call_command("review_queue", "other", "--rubric", "nope")
    call_command("review_queue", "spot", "--rubric", "correctness", "--filter", "verifier=verifier/numeric",
                 "--filter", "reward_min=0.5", "--sample", "random:3", "--follow", "0.25",
                 "--reviewers", "reviewer-user")
    spot = ReviewQueue.objects.get(slug="spot")
    assert spot.follow_share == 0.25 and spot.filters == {"verifier": "verifier/numeric", "reward_min": "0.5"}
    assert {item.trajectory.reward for item in spot.items.select_related("trajectory")} == {1.0}
    with pytest.raises(CommandError, match="reward_min 'lots' is not a number"):
        call_command("review_queue", "other", "--rubric", "correctness", "--filter", "reward_min=lots")
    with pytest.raises(CommandError, match="no trajectory filter 'colour'"):
        call_command("review_queue", "other", "--rubric", "correctness", "--filter", "colour=red")
    with pytest.raises(CommandError, match="sampling rule 'vibes'"):
        call_command("review_queue", "other", "--rubric", "correctness", "--sample", "vibes:3")

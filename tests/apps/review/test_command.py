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
    call_command("review_queue", "spot", "--rubric", "correctness", "--spot-check", "0.25:numeric",
                 "--reviewers", "reviewer-user")
    spot = ReviewQueue.objects.get(slug="spot")
    assert (spot.spot_check_share, spot.spot_check_verifier) == (0.25, "numeric")
    with pytest.raises(CommandError, match="write SHARE:VERIFIER"):
        call_command("review_queue", "other", "--rubric", "correctness", "--spot-check", "lots:numeric")
    with pytest.raises(CommandError, match="sampling rule 'vibes'"):
        call_command("review_queue", "other", "--rubric", "correctness", "--sample", "vibes:3")

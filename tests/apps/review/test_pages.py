"""The queue form: drawn in the browser from the trajectory browser's filters, its mistakes shown at their field,
and only for editors."""

from django.urls import reverse

from apps.accounts.models import AuditEvent
from apps.review.models import ReviewQueue


def test_a_queue_drawn_from_the_form_with_the_browsers_filters(client, project, archive, rubric, owner, member):
    ann = member("reviewer")
    client.force_login(owner)
    url = reverse("review:queue_new", kwargs={"project": project.slug})
    # Opened from the trajectory browser: its query string fills in the filters.
    page = client.get(url, {"domain": "coding", "reward_min": "0.5", "sort": "recent"})
    assert page.status_code == 200
    assert page.context["form"]["domain"].value() == "coding" and page.context["form"]["reward_min"].value() == "0.5"
    browser = client.get(reverse("trajectories:trajectory_list", kwargs={"project": project.slug}),
                         {"domain": "coding"}).content.decode()
    assert f"{url}?domain=coding" in browser.replace("&amp;", "&")

    form = {"slug": "coding-passes", "rubric": rubric.pk, "domain": "coding", "reward_min": "0.5", "rule": "random",
            "n": "50", "overlap": "1", "blind": "on", "reviewers": [ann.pk], "reservation_minutes": "10",
            "follow_share": "0.1"}
    done = client.post(url, form)
    assert done.status_code == 302 and done.url.endswith("/review/coding-passes/")
    queue = ReviewQueue.objects.get(slug="coding-passes")
    drawn = list(queue.items.select_related("trajectory"))
    # The archive: 30 trajectories, even seqs "arithmetic", odd "coding", reward 1 when seq % 3 == 0.
    assert sorted(item.trajectory.seq for item in drawn) == [3, 9, 15, 21, 27]
    assert (queue.reservation_seconds, queue.follow_share, queue.blind) == (600, 0.1, True)
    assert AuditEvent.objects.filter(action="review.queue.create", target="queue/coding-passes").exists()

    # The service's refusals land at their field; nothing is drawn.
    again = client.post(url, {**form, "slug": "other", "reward_min": "5", "follow_share": "0"})
    assert again.status_code == 400 and "no trajectory matches" in str(again.context["form"].errors)
    taken = client.post(url, {**form, "reward_min": ""})
    assert taken.status_code == 400 and "already has a queue" in str(taken.context["form"]["slug"].errors)
    assert ReviewQueue.objects.count() == 1


def test_only_editors_draw_queues(client, project, archive, rubric, member):
    client.force_login(member("reviewer"))
    url = reverse("review:queue_new", kwargs={"project": project.slug})
    assert client.get(url).status_code in (403, 404)
    listing = client.get(reverse("review:queue_list", kwargs={"project": project.slug})).content.decode()
    assert url not in listing

"""`manage.py review_queue SLUG --rubric RUBRIC [--sample RULE:N] [--filter NAME=VALUE ...] [--overlap N]
[--reviewers a,b] [--adjudicators c] [--open] [--follow SHARE] [--project SLUG] [--if-absent]`:
draw a review queue of archived trajectories, as the API does (apps/review/services.py). `make demo` draws the
demo's queue with it."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from apps.accounts.selectors import project_for_command
from apps.registry.errors import VersionNotFound
from apps.registry.refs import Ref, split_slug_ref
from apps.registry.selectors import version_resolve
from apps.review.models import ReviewQueue
from apps.review.services import ReviewError, queue_create


class Command(BaseCommand):
    help = "Draw a queue of archived trajectories for people to review with a rubric."

    def add_arguments(self, parser):
        parser.add_argument("slug")
        parser.add_argument("--rubric", required=True, help="rubric SLUG, SLUG@N or SLUG@alias")
        parser.add_argument("--sample", default="random:100",
                            help="RULE:N with RULE random, stratified, judged, judge_doubtful, disagree or "
                                 "hack_shaped")
        parser.add_argument("--filter", action="append", default=[], metavar="NAME=VALUE", dest="filters",
                            help="a trajectory browser filter (run, domain, template, verifier, status, "
                                 "verdict_status, deciding_layer, policy_version, task_key, reward_min, "
                                 "reward_max); repeatable")
        parser.add_argument("--overlap", type=int, default=1, help="reviewers per item")
        parser.add_argument("--open", action="store_true", dest="not_blind",
                            help="not blind: reviewers see each other's labels")
        parser.add_argument("--reviewers", default="", help="usernames, comma-separated")
        parser.add_argument("--adjudicators", default="", help="usernames, comma-separated")
        parser.add_argument("--follow", metavar="SHARE", type=float, default=0.0,
                            help="keep drawing: this share of what the filters and rule select among the "
                                 "trajectories runs archive from now on joins the queue. A judge's spot checks: "
                                 "--filter verifier=verifier/SLUG --sample judged:N --follow 0.05")
        parser.add_argument("--description", default="")
        parser.add_argument("--project", help="project slug (default: the only project)")
        parser.add_argument("--if-absent", action="store_true", help="do nothing if the queue exists")

    def handle(self, *args, slug, rubric, sample, filters, overlap, not_blind, reviewers, adjudicators, follow,
               description, project, if_absent, **_):
        scope = project_for_command(slug=project)
        if if_absent and ReviewQueue.objects.filter(project=scope, slug=slug).exists():
            self.stdout.write(f"queue {slug} exists; nothing drawn")
            return
        rule, _, count = sample.partition(":")
        if not count.isdigit():
            raise CommandError(f"--sample {sample!r}: write RULE:N, e.g. stratified:20")
        chosen = {}
        for pair in filters:
            name, equals, value = pair.partition("=")
            if not equals:
                raise CommandError(f"--filter {pair!r}: write NAME=VALUE")
            chosen[name] = value
        users = get_user_model().objects
        try:
            version = version_resolve(project=scope, ref=Ref("rubric", *split_slug_ref(rubric)))
            queue = queue_create(
                project=scope, slug=slug, rubric=version, actor=None, filters=chosen,
                sampling={"rule": rule, "n": int(count)}, overlap=overlap, blind=not not_blind,
                reviewers=[users.get(username=name) for name in reviewers.split(",") if name],
                adjudicators=[users.get(username=name) for name in adjudicators.split(",") if name],
                description=description, follow_share=follow, via="cli")
        except (VersionNotFound, ReviewError) as exc:
            raise CommandError(str(exc)) from None
        except users.model.DoesNotExist:
            raise CommandError("a reviewer or adjudicator named is not a user") from None
        self.stdout.write(f"queue {queue.slug}: {queue.items.count()} items, overlap {queue.overlap}, "
                          f"rubric {version.ref}")

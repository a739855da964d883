from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand

from apps.demo.generated import LIBRARY, seed_generated
from apps.demo.seed import USERNAME, seed


class Command(BaseCommand):
    help = "Create the demo user, team and project, and publish the demo registry (safe to run again)."

    def add_arguments(self, parser):
        parser.add_argument("--domains", choices=[LIBRARY],
                            help="also publish the hundred-domain demo: a domain per dataset of this generator "
                                 "library, and its bundles demo-reasoning-gym and demo-reasoning-gym-smollm")

    def handle(self, *args, domains=None, **options):
        summary = seed(stdout=self.stdout)
        if domains:
            user = get_user_model().objects.get(username=USERNAME)
            for bundle in seed_generated(project=summary.project, user=user, stdout=self.stdout):
                self.stdout.write(f"{bundle.ref}: {len(bundle.spec['resolved'])} definitions pinned")

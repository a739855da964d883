from django.core.management.base import BaseCommand

from apps.demo.seed import seed


class Command(BaseCommand):
    help = "Create the demo user, team and project, and publish the demo registry (safe to run again)."

    def handle(self, *args, **options):
        seed(stdout=self.stdout)

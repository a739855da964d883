"""`manage.py cold_start --bundle demo-smollm [--steps N] [--project SLUG]`: the real-model demo's SFT cold start
(apps/demo/cold_start.py): a dataset of the bundle's reference check's tool-calling trajectories and an SFT run on
it, trained here; nothing when that run already trained on that dataset version. `make demo MODEL=smollm` runs it
before queueing the GRPO run, which starts from its checkpoint."""

from django.core.management.base import BaseCommand, CommandError

from apps.accounts.selectors import project_for_command
from apps.datasets.errors import DatasetError
from apps.demo.cold_start import STEPS, cold_start


class Command(BaseCommand):
    help = "Train the SFT cold start a demo bundle's GRPO run starts from (its reference check's tool calls)."

    def add_arguments(self, parser):
        parser.add_argument("--bundle", required=True, help="the bundle slug whose reference check it trains on")
        parser.add_argument("--steps", type=int, default=STEPS)
        parser.add_argument("--project", help="project slug (default: the only project)")

    def handle(self, *args, bundle, steps, project, **_):
        try:
            run = cold_start(project=project_for_command(slug=project), bundle=bundle, steps=steps,
                             stdout=self.stdout)
        except DatasetError as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(f"\nthe GRPO run starts from: checkpoint {run.name}@latest")

"""`manage.py cold_start --bundle demo-smollm [--template SLUG ...] [--steps N] [--project SLUG]`: the real-model
demo's SFT cold start (apps/demo/cold_start.py): a dataset of the passing trajectories of the bundle's reference
check (of the templates named; none, every template) and an SFT run on it, trained here; nothing when that run
already trained on that dataset version. `make demo MODEL=smollm` runs it
before queueing the GRPO run, which starts from its checkpoint."""

from django.core.management.base import BaseCommand, CommandError

from apps.accounts.selectors import project_for_command
from apps.datasets.errors import DatasetError
from apps.demo.cold_start import STEPS, cold_start


class Command(BaseCommand):
    help = "Train the SFT cold start a demo bundle's GRPO run starts from (its reference check's passing answers)."

    def add_arguments(self, parser):
        parser.add_argument("--bundle", required=True, help="the bundle slug whose reference check it trains on")
        parser.add_argument("--template", action="append", default=[], dest="templates", metavar="SLUG",
                            help="a task template whose references it trains on (repeat; default: every template)")
        parser.add_argument("--steps", type=int, default=STEPS)
        parser.add_argument("--project", help="project slug (default: the only project)")

    def handle(self, *args, bundle, templates, steps, project, **_):
        try:
            run = cold_start(project=project_for_command(slug=project), bundle=bundle, templates=tuple(templates),
                             steps=steps, stdout=self.stdout)
        except DatasetError as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(f"\nthe GRPO run starts from: checkpoint {run.name}@latest")

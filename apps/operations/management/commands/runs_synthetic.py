"""`manage.py runs_synthetic`: a run with synthetic metrics and trajectories, written the way a worker writes."""

from django.core.management.base import BaseCommand, CommandError

from apps.accounts.selectors import project_for_command
from apps.operations.synthetic import run_synthetic_create, run_synthetic_steps
from apps.registry.models import Version


class Command(BaseCommand):
    help = "Write a synthetic run (metrics, events, trajectories with tool calls and screenshots) for the pages."

    def add_arguments(self, parser):
        parser.add_argument("--project", help="project slug (default: the only project)")
        parser.add_argument("--bundle", default="demo", help="bundle slug; its newest version is pinned")
        parser.add_argument("--steps", type=int, default=200)
        parser.add_argument("--seconds-per-step", type=float, default=0.0,
                            help="pause between steps, to watch the run page move live")
        parser.add_argument("--name", default="synthetic")

    def handle(self, *args, project, bundle, steps, seconds_per_step, name, **options):
        try:
            project = project_for_command(slug=project)
        except LookupError as exc:
            raise CommandError(str(exc)) from None
        version = (Version.objects.filter(definition__project=project, definition__kind="bundle",
                                          definition__slug=bundle).order_by("-number").first())
        if version is None:
            raise CommandError(f"No bundle {bundle!r} in {project.slug}; publish one or run seed_demo.")
        run = run_synthetic_create(project=project, bundle=version, steps=steps, name=name)
        self.stdout.write(f"run {run.pk}: /p/{project.slug}/runs/{run.pk}/")
        run_synthetic_steps(run=run, steps=steps, seconds_per_step=seconds_per_step)
        self.stdout.write(f"wrote {steps} steps")

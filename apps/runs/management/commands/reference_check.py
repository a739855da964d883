"""`manage.py reference_check --bundle SLUG[@N] [--per-template N] [--project SLUG] [--if-absent] [--json]`:
verify the bundle's reference answers in its sandboxes (apps/runs/attempts/reference.py); a run of its own that the
pages show like any other. Exits non-zero if a reference failed its verifier (one that could not be graded, for
want of a judge say, is reported but is not a failure)."""

from __future__ import annotations

import json

from django.core.management.base import BaseCommand, CommandError
from rich.console import Console
from rich.table import Table

from apps.accounts.selectors import project_for_command
from apps.registry.errors import VersionNotFound
from apps.registry.refs import Ref, split_slug_ref
from apps.registry.selectors import version_resolve
from apps.runs.attempts import Unfinished, run_attempt
from apps.runs.models import Run, RunKind, RunStatus
from apps.runs.services import RunError, run_claim, run_create


class Command(BaseCommand):
    help = "Check that a bundle's reference answers pass its verifiers in its sandboxes (a run of one step)."

    def add_arguments(self, parser):
        parser.add_argument("--bundle", required=True, help="bundle SLUG, SLUG@N or SLUG@alias")
        parser.add_argument("--project", help="project slug (default: the only project)")
        parser.add_argument("--per-template", type=int, default=3, help="references checked per task template")
        parser.add_argument("--if-absent", action="store_true",
                            help="do nothing if this bundle version already has a completed reference check")
        parser.add_argument("--json", action="store_true", dest="as_json", help="print the summary as JSON")

    def handle(self, *args, bundle, project, per_template, if_absent, as_json, **_):
        console = Console(stderr=True)
        if per_template < 1:
            raise CommandError("--per-template must be at least 1")
        try:
            scope = project_for_command(slug=project)
            version = version_resolve(project=scope, ref=Ref("bundle", *split_slug_ref(bundle)))
            done = Run.objects.filter(project=scope, bundle=version, status=RunStatus.COMPLETED,
                                      kind=RunKind.REFERENCE).first()
            if if_absent and done is not None:
                console.print(f"{version.ref} has a reference check already: run [bold]{done.name}[/]")
                return
            run = run_create(project=scope, bundle=version, steps=1, name=f"reference check {version.ref}",
                             kind=RunKind.REFERENCE, via="cli",
                             overrides={"reference_per_template": per_template})
        except (LookupError, VersionNotFound, RunError) as exc:
            raise CommandError(str(exc))
        attempt = run_claim(run_id=run.pk, stale_after=0)
        with console.status(f"verifying the references of {version.ref} in their sandboxes"):
            try:
                summary = run_attempt(run_id=run.pk, attempt=attempt)
            except ValueError as exc:
                raise CommandError(str(exc))
        if isinstance(summary, Unfinished):
            raise CommandError(f"the check stopped before its end (see the log); run {run.name} is left to be "
                               "checked again by a worker")
        if as_json:
            self.stdout.write(json.dumps(summary))
        else:
            table = Table("template", "passed", "failed", "ungraded", "first that did not pass")
            for key, entry in summary["templates"].items():
                problem = entry["first_problem"]
                table.add_row(key, f"{entry['passed']}/{entry['checked']}", str(entry["failed"]),
                              str(entry["ungraded"]), f"{problem['task']}: {problem['why']}" if problem else "")
            console.print(table)
            console.print(f"its page: /p/{scope.slug}/runs/{run.pk}/")
        if summary["ungraded"]:
            console.print(f"[yellow]{summary['ungraded']} references could not be graded[/] (see the table: "
                          "a judge layer needs JUDGE_BASE_URL; a sandbox image may not start here)")
        if summary["failed"]:
            raise CommandError(f"{summary['failed']} of {summary['checked']} references failed their verifier: "
                               "see the table or the run's events")

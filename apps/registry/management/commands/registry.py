"""`manage.py registry export DIR | import DIR | diff KIND/SLUG@A B` — environments as code."""

import sys
from pathlib import Path

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from apps.accounts.selectors import project_for_command
from apps.registry.diff import spec_diff
from apps.registry.errors import VersionNotFound
from apps.registry.files import ImportFailed, export_project, import_directory
from apps.registry.refs import Ref, parse_ref
from apps.registry.selectors import version_resolve


class Command(BaseCommand):
    help = "Export the registry as YAML files, import such files as new versions, or diff two versions."

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="action", required=True)
        export = sub.add_parser("export", help="write every definition of a project as YAML, one file each")
        export.add_argument("directory", type=Path)
        export.add_argument("--project", help="project slug (default: the only project)")
        imp = sub.add_parser("import", help="publish what changed in DIR as new versions; all or nothing")
        imp.add_argument("directory", type=Path)
        imp.add_argument("--project", help="project slug (default: DIR/project.yaml); created if absent")
        imp.add_argument("--user", help="author of the new versions, and owner of a project the import creates")
        imp.add_argument("--message", default="", help="message of the new versions")
        diff = sub.add_parser("diff", help="structural diff: registry diff KIND/SLUG@A B")
        diff.add_argument("old", help="KIND/SLUG@A")
        diff.add_argument("new", help="B: a number, an alias, latest, or a full KIND/SLUG@B")
        diff.add_argument("--project", help="project slug (default: the only project)")

    def handle(self, *args, action, **options):
        getattr(self, f"handle_{action}")(**options)

    def project(self, slug: str | None):
        try:
            return project_for_command(slug=slug)
        except LookupError as exc:
            raise CommandError(str(exc))

    def handle_export(self, *, directory: Path, project: str | None, **_):
        written = export_project(project=self.project(project), directory=directory)
        self.stdout.write(f"Wrote {len(written)} files to {directory}.")

    def handle_import(self, *, directory: Path, project: str | None, user: str | None, message: str, **_):
        actor = None
        if user:
            actor = get_user_model().objects.filter(username=user).first()
            if actor is None:
                raise CommandError(f"No user {user!r}.")
        try:
            report = import_directory(directory=directory, project_slug=project, actor=actor, message=message)
        except ImportFailed as failed:
            for error in failed.errors:
                self.stderr.write(f"  {error}")
            raise CommandError(f"{len(failed.errors)} error(s) in {directory}; nothing was imported.")
        if report.project_created:
            owner = f"owned by {user}" if user else "with no members yet (pass --user to own it)"
            self.stdout.write(f"Created the project, {owner}.")
        for ref in report.published:
            self.stdout.write(f"  published {ref}")
        for line in report.aliases_moved:
            self.stdout.write(f"  moved {line}")
        self.stdout.write(f"{len(report.published)} new version(s), {len(report.unchanged)} unchanged, "
                          f"{len(report.aliases_moved)} alias move(s).")

    def handle_diff(self, *, old: str, new: str, project: str | None, **_):
        scope = self.project(project)
        try:
            old_ref = parse_ref(old)
            new_ref = parse_ref(new) if "/" in new else Ref(old_ref.kind, old_ref.slug, new)
            a = version_resolve(project=scope, ref=old_ref)
            b = version_resolve(project=scope, ref=new_ref)
        except VersionNotFound as exc:
            raise CommandError(str(exc))
        changes = spec_diff(a.spec, b.spec)
        self.stdout.write(f"{a.ref} -> {b.ref}: {len(changes)} change(s)")
        for change in changes:
            self.stdout.write(str(change))
        sys.stdout.flush()

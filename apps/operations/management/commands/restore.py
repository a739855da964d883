"""`manage.py restore DIR`: a backup of `manage.py backup` into this studio, which must be empty (a new database
and data directory or bucket), then checked: every table's rows, every object, each project's registry export and
each run's counts (apps/operations/backups)."""

from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from apps.operations.backups import BackupError, restore


class Command(BaseCommand):
    help = "Restore a backup made by `manage.py backup` into this studio, which must be empty; then check it."

    def add_arguments(self, parser):
        parser.add_argument("directory", type=Path)

    def handle(self, *args, directory: Path, **_):
        try:
            restore(directory=directory, say=self.say)
        except BackupError as exc:
            raise CommandError(str(exc))

    def say(self, line: str) -> None:
        self.stdout.write(line)
        self.stdout.flush()

"""`manage.py backup DIR`: a consistent snapshot of this studio (its database, its blob storage's objects, the
settings that matter without their secrets, a manifest to check a restore against) in a new directory
(apps/operations/backups)."""

from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from apps.operations.backups import BackupError, backup


class Command(BaseCommand):
    help = "Back up the studio (database, blobs, settings without secrets) into DIR, which must be new or empty."

    def add_arguments(self, parser):
        parser.add_argument("directory", type=Path)
        parser.add_argument("--no-models", action="store_true",
                            help="leave out the base models (models/): converted ones are made again from their "
                                 "packages, but a demo model pretrained again differs from the one runs started from")

    def handle(self, *args, directory: Path, no_models: bool, **_):
        try:
            backup(directory=directory, say=self.say, models=not no_models)
        except BackupError as exc:
            raise CommandError(str(exc))

    def say(self, line: str) -> None:
        self.stdout.write(line)
        self.stdout.flush()

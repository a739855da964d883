"""Backups of a whole studio and their restore into an empty one (`manage.py backup DIR`, `manage.py restore
DIR`): the database (database.py), the blob storage's objects (blobs.py), put together and checked in snapshot.py."""

from .errors import BackupError
from .snapshot import backup, restore

__all__ = ["BackupError", "backup", "restore"]

from apps.common.errors import StudioError


class BackupError(StudioError):
    """A backup or a restore that cannot be made, or did not check out: what went wrong and what to do."""

    status = 409

from apps.common.errors import StudioError


class DatasetError(StudioError, ValueError):
    """A dataset build or upload refused, in words for the person who asked for it."""

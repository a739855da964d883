from workers.definitions.specs import FieldError, SpecError

__all__ = ["FieldError", "SpecError", "VersionNotFound", "PublishConflict"]


class VersionNotFound(LookupError):
    """A reference (kind/slug@N, @alias, @latest) that names nothing in this project."""


class PublishConflict(Exception):
    """The version an edit started from is no longer the newest: someone published in between."""

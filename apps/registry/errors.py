from workers.definitions.specs import FieldError, SpecError

__all__ = ["FieldError", "SpecError", "ReferenceNotFound", "VersionNotFound", "PublishConflict"]


class VersionNotFound(LookupError):
    """A reference (kind/slug@N, @alias, @latest) that names nothing in this project."""


class PublishConflict(Exception):
    """The version an edit started from is no longer the newest: someone published in between."""


class ReferenceNotFound(SpecError):
    """A spec that is well formed but names definitions or versions that do not exist in the project: like an
    unknown id in a path, the API answers 404 (with each reference's field path), not 422."""

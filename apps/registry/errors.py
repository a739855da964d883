from apps.common.errors import StudioError
from workers.definitions.specs import FieldError, SpecError

__all__ = ["FieldError", "SpecError", "ReferenceNotFound", "VersionNotFound", "PublishConflict"]


class VersionNotFound(StudioError, LookupError):
    """A reference (kind/slug@N, @alias, @latest) that names nothing in this project."""

    status = 404


class PublishConflict(StudioError):
    """The version an edit started from is no longer the newest: someone published in between."""

    status = 409


class ReferenceNotFound(SpecError, StudioError):
    """A spec that is well formed but names definitions or versions that do not exist in the project: like an
    unknown id in a path, the API answers 404 (with each reference's field path), not 422 (a SpecError's)."""

    status = 404

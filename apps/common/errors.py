"""One base for the refusals the studio words for the person who made them.

A StudioError says what was wrong (its message), which field of the request it is about (`field`, or `errors`
when several fields are wrong) and the HTTP status an API answers it with. Every app's refusals derive from
it (RunError, EvalError, ReviewError, VersionNotFound, ...): the API answers them all in one handler
(api_errors.py), and a page puts each field's problem at its form field.

The engine (workers/) imports no Django and none of this: its errors that name fields carry the same FieldError
list (SpecError, ConfigError), and api_errors.py gives them their status.
"""

from __future__ import annotations

from collections.abc import Sequence

from workers.definitions.specs import FieldError

__all__ = ["FieldError", "StudioError"]


class StudioError(Exception):
    status = 400  # a subclass's usual status; one refusal may say another
    field = ""
    errors: Sequence[FieldError] = ()

    def __init__(self, message: str = "", *, status: int | None = None, field: str = "",
                 errors: Sequence[FieldError] = ()):
        self.errors = list(errors) or ([FieldError(field, message)] if field else [])
        super().__init__(message or "; ".join(map(str, self.errors)))
        self.field = field
        if status is not None:
            self.status = status

    def about(self, field: str) -> StudioError:
        """This refusal, about `field` of the request: a view knows which field a lookup it made came from."""
        self.field, self.errors = field, [FieldError(field, str(self))]
        return self

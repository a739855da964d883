"""How the REST API answers a mistake: always JSON, always a 4xx that says what was wrong and where.

Every error body has the same shape, `{"detail": "...", "errors": [{"field": ..., "problem": ...}]}`, whether
the problem was found by ninja (a malformed request), by an app (a StudioError: its status, message and fields)
or by the engine (a spec or a run config that does not validate), so a client needs one error handler — and
an endpoint lets the app's refusal through instead of answering it itself.
"""

import logging
import secrets
from collections.abc import Sequence

from django.conf import settings
from django.core.exceptions import PermissionDenied, RequestDataTooBig
from django.db import DataError
from django.http import Http404, JsonResponse
from ninja import NinjaAPI, Schema
from ninja.errors import AuthenticationError, HttpError, ValidationError

from workers.definitions.specs import ALIAS_RE, SLUG_RE, FieldError, SpecError
from workers.rl.config import ConfigError

from .errors import StudioError

logger = logging.getLogger(__name__)
API_PREFIX = "/api/"


class FieldProblem(Schema):
    field: str
    problem: str


class ErrorOut(Schema):
    detail: str
    errors: list[FieldProblem] = []


# For the OpenAPI document: the error statuses each kind of endpoint can answer.
READ_ERRORS = {frozenset({401, 403, 404, 422}): ErrorOut}
WRITE_ERRORS = {frozenset({400, 401, 403, 404, 409, 413, 422}): ErrorOut}

# The engine's refusals name their fields but know no HTTP: the status each is answered with.
ENGINE_ERRORS = {SpecError: 422, ConfigError: 400}
# pydantic reports a pattern mismatch by quoting the regex; say in words what a valid value looks like.
PATTERN_HINTS = {
    f"^{SLUG_RE}$": "use 1-63 lowercase letters, digits and hyphens, starting with a letter or digit "
                  "(no '/', '.', spaces)",
    f"^{ALIAS_RE}$": "an alias is lowercase letters, digits and hyphens, starting with a letter, at most 63 "
                     "characters",
}
UNAUTHENTICATED = ("Authentication required: send the header 'Authorization: Bearer pts_...' with an API token, "
                   "or sign in to the studio in this browser.")


def register_exception_handlers(api: NinjaAPI) -> None:
    def answer(request, status: int, detail: str, errors: Sequence[FieldError] = ()):
        body = {"detail": detail, "errors": [{"field": e.field, "problem": e.problem} for e in errors]}
        return api.create_response(request, body, status=status)

    def refused(request, exc: StudioError | SpecError | ConfigError):
        """A refusal worded for the person who made it: an app's (its own status) or the engine's."""
        status = exc.status if isinstance(exc, StudioError) else next(
            status for kind, status in ENGINE_ERRORS.items() if isinstance(exc, kind))
        return answer(request, status, str(exc), exc.errors)

    for refusal in (StudioError, *ENGINE_ERRORS):
        api.add_exception_handler(refusal, refused)

    @api.exception_handler(ValidationError)
    def request_invalid(request, exc: ValidationError):
        errors = [_request_problem(error) for error in exc.errors]
        return answer(request, 422, "Invalid request: " + "; ".join(map(str, errors)), errors)

    @api.exception_handler(Http404)
    def not_found(request, exc: Http404):
        return answer(request, 404, str(exc) or "Not found.")

    @api.exception_handler(PermissionDenied)
    def forbidden(request, exc: PermissionDenied):
        return answer(request, 403, str(exc) or "You do not have permission to do this.")

    @api.exception_handler(AuthenticationError)
    def unauthenticated(request, exc: AuthenticationError):
        # ninja raises a bare AuthenticationError ("Unauthorized") when no way of signing in was tried.
        response = answer(request, 401, UNAUTHENTICATED if exc.message == "Unauthorized" else exc.message)
        response["WWW-Authenticate"] = 'Bearer realm="api"'
        return response

    @api.exception_handler(RequestDataTooBig)
    def body_too_big(request, exc: RequestDataTooBig):
        # Raised by Django when ninja first reads request.body; left alone it becomes an HTML 400 page.
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        size = int(request.META.get("CONTENT_LENGTH") or 0)
        return answer(request, 413, f"The request body is {size / 2**20:.1f} MiB; the limit is {limit / 2**20:.0f} "
                                    "MiB (STUDIO_MAX_REQUEST_BYTES). Put task data in task instances and import "
                                    "large instance sets from a file.")

    @api.exception_handler(HttpError)
    def http_error(request, exc: HttpError):
        # ninja turns a body it cannot parse into a 400 "Cannot parse request body"; say what was wrong.
        cause = exc.__cause__  # JSONDecodeError, UnicodeDecodeError, RecursionError (nested too deeply)
        if isinstance(cause, HttpError):  # our parser's own refusal (apps/common/json_body.py), wrapped by ninja
            return answer(request, cause.status_code, cause.message, [FieldError("body", cause.message)])
        if cause is not None:
            return answer(request, 400, f"The request body is not valid JSON: {cause}.",
                          [FieldError("body", str(cause))])
        return answer(request, exc.status_code, exc.message)

    @api.exception_handler(DataError)
    def value_not_storable(request, exc: DataError):
        # The database refused a value the validation let through (e.g. a NUL character on PostgreSQL).
        logger.warning("API request refused by the database: %s", exc)
        return answer(request, 400, f"A value in the request cannot be stored: {exc}".strip())

    @api.exception_handler(Exception)
    def server_error(request, exc: Exception):
        # Our fault, never the client's: logged with its traceback under a reference the client can quote; the
        # answer says nothing about the server's insides, whatever DEBUG says.
        reference = secrets.token_hex(6)
        logger.error("API %s %s failed (reference %s)", request.method, request.path, reference, exc_info=exc)
        return answer(request, 500, f"The server failed to answer this request (reference {reference}); it is "
                                    "logged and is not a problem with the request.")


class JsonErrorsUnderApi:
    """Every error the API answers is JSON in the API's shape, including the ones Django and ninja answer
    outside its handlers: 405 for a method an endpoint does not take (plain text from ninja), and anything a
    middleware raised before ninja ran (Django's HTML page)."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        response = self.get_response(request)
        if (not request.path.startswith(API_PREFIX) or response.status_code < 400
                or response.get("Content-Type", "").startswith("application/json")):
            return response
        if response.status_code == 405:
            allowed = response.get("Allow", "")
            detail = f"{request.method} is not allowed on {request.path}; it takes {allowed or 'no method'}."
        else:
            detail = {400: "Bad request.", 403: "Forbidden.", 404: "Not found.", 413: "The request body is too "
                      "large."}.get(response.status_code, f"The server answered {response.status_code}.")
        body = JsonResponse({"detail": detail, "errors": []}, status=response.status_code)
        if response.has_header("Allow"):
            body["Allow"] = response["Allow"]
        return body


def _request_problem(error: dict) -> FieldError:
    """ninja's error `loc` is (source, [body parameter,] field, ...); name the field as the client wrote it."""
    source, *path = error["loc"]
    if source == "body":
        path = path[1:]  # the view's body parameter name, which the client never sees
    field = "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in path).lstrip(".")
    problem = PATTERN_HINTS.get(error.get("ctx", {}).get("pattern"), error["msg"])
    if source != "body":
        problem += f" ({source} parameter)"
    return FieldError(field or source, problem)

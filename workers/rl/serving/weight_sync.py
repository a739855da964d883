"""What the two OpenAI-compatible servers share — the studio's own (app.py) and vLLM's with the studio's weight
sync added (vllm_server.py): the error body their routes answer with, the bearer-token check, and the weight
sync itself.

`POST /v1/weights {"location": URL or directory, "policy_version": N}` loads a published weights directory
(workers/storage) and serves it from the next request on. Who may call it (`may_load`): with a token, a request
that carries it as its bearer token; without one, only loopback clients. The swap (`swap_between_requests`)
happens at the `Gate` every completion passes: new requests wait while the ones in flight finish on the old
weights, then run on the new. `GET /v1/weights` says the version served.
"""

from __future__ import annotations

import asyncio
import hmac
import time

from starlette.requests import Request
from starlette.responses import JSONResponse

LOOPBACK = ("127.0.0.1", "::1", "localhost")


class BadRequest(ValueError):
    """A request the server refuses as the client's mistake (400), with what was wrong (`param`: the parameter
    at fault, where one is)."""

    def __init__(self, message: str, *, param: str | None = None):
        super().__init__(message)
        self.param = param


def error_response(status: int, message: str, kind: str = "invalid_request_error",
                   param: str | None = None) -> JSONResponse:
    """An error as OpenAI's API answers one."""
    return JSONResponse({"error": {"message": message, "type": kind, "param": param, "code": None}},
                        status_code=status)


def is_bearer(authorization: str, token: str) -> bool:
    """Whether an Authorization header carries `token` as its bearer token (compared in constant time)."""
    return hmac.compare_digest(authorization.encode(), f"Bearer {token}".encode())


class Gate:
    """Requests in flight, and a weight swap that waits for them while holding new ones back (one event loop:
    no locks)."""

    def __init__(self, version: int):
        self.in_flight = 0
        self.open = asyncio.Event()
        self.open.set()
        self.idle = asyncio.Event()
        self.idle.set()
        self.swap = asyncio.Lock()
        self.version = version

    async def enter(self) -> None:
        while not self.open.is_set():
            await self.open.wait()
        self.in_flight += 1
        self.idle.clear()

    def leave(self) -> None:
        self.in_flight -= 1
        if not self.in_flight:
            self.idle.set()


def may_load(authorization: str, client_host: str | None, token: str) -> bool:
    """Who may load weights: with a token, a request that carries it as its bearer token; without one, only
    loopback clients."""
    if token:
        return is_bearer(authorization, token)
    return client_host in LOOPBACK


def loading_refused(token: str) -> JSONResponse:
    return error_response(401, "loading weights needs the server's bearer token" if token else
                          "loading weights is open to loopback clients only (set a token to allow others)",
                          "authentication_error")


async def weights_request(request: Request) -> tuple[str, int]:
    """(location, policy_version) of a `POST /v1/weights` body; BadRequest if either is missing or wrong."""
    try:
        body = await request.json()
    except ValueError:
        raise BadRequest("the body is not JSON") from None
    location, version = (body.get("location"), body.get("policy_version")) if isinstance(body, dict) \
        else (None, None)
    if not isinstance(location, str) or not location:
        raise BadRequest("location: the URL or directory of a published weights directory is needed")
    if isinstance(version, bool) or not isinstance(version, int) or version < 0:
        raise BadRequest("policy_version must be a whole number, 0 or more")
    return location, version


async def swap_between_requests(gate: Gate, load, version: int) -> float:
    """Awaits `load()` while no request is in flight — new ones wait while the ones in flight finish on the old
    weights — and, if it succeeds, serves `version` from the next request on. Returns the seconds requests were
    held back."""
    started = time.monotonic()
    async with gate.swap:
        gate.open.clear()  # new requests wait ...
        try:
            await gate.idle.wait()  # ... while the ones in flight finish on the old weights
            await load()  # swapped in before the next request is admitted
            gate.version = version
        finally:
            gate.open.set()
    return time.monotonic() - started

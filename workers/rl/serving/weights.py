"""`GET/POST /v1/weights` on the studio's own server (the contract both servers keep: weight_sync.py). A
published weights directory (workers/storage; its `model.safetensors` holds the trainer's names) is read from
the object store or disk before anything pauses and checked against the served model, then swapped in between
requests: new requests wait while the ones in flight finish on the old weights, then run on the new."""

from __future__ import annotations

import asyncio
from pathlib import Path

from starlette.requests import Request
from starlette.responses import JSONResponse

from workers.storage import Storage

from .served_model import ServedModel
from .weight_sync import BadRequest, error_response, loading_refused, may_load, swap_between_requests, weights_request


def read_weights(location: str) -> dict:
    """The state dict of the published weights directory at `location` (an object store's URL or a local
    directory), downloaded into this host's cache if remote."""
    from safetensors.torch import load_file

    def load(directory: Path) -> dict:
        path = directory / "model.safetensors"
        if not path.is_file():
            raise FileNotFoundError(f"{location} holds no model.safetensors")
        return load_file(str(path))

    if "://" not in location:
        return load(Path(location))
    with Storage(location).fetched() as directory:  # not evicted from the host's cache while it is read
        return load(directory)


def check_fits(engine, state: dict) -> None:
    """Refuses (BadRequest) weights whose names or shapes are not the served model's, before they are swapped
    in: the engine would fail every request of its next batch instead. Engines without a torch module (vLLM)
    check in their own load."""
    model = getattr(engine, "model", None)
    if model is None or not hasattr(model, "state_dict"):
        return
    expected = {name: tuple(value.shape) for name, value in model.state_dict().items()}
    missing = [n for n in expected if n not in state and not n.endswith("lm_head.weight")]
    unexpected = [n for n in state if n not in expected]
    wrong = [n for n, value in state.items() if n in expected and tuple(value.shape) != expected[n]]
    if missing or unexpected or wrong:
        raise BadRequest(f"the weights do not fit the served model: missing {missing[:3]}, unexpected "
                         f"{unexpected[:3]}, other shapes {wrong[:3]}")


def weights(served: ServedModel, *, token: str = ""):
    """The route's handler for `served`; `token`: the bearer token a load needs (empty: loopback clients only)."""
    engine = served.engine

    async def endpoint(request: Request):
        if request.method == "GET":
            return JSONResponse({"model": served.model_name, "policy_version": served.gate.version})
        if not may_load(request.headers.get("authorization", ""), request.client.host if request.client else None,
                        token):
            return loading_refused(token)
        try:
            location, version = await weights_request(request)
            try:  # read before anything pauses: a download must not hold requests back
                state = await asyncio.to_thread(read_weights, location)
            except (OSError, ValueError) as exc:
                raise BadRequest(f"could not read weights from {location}: {exc}") from None
            check_fits(engine, state)
        except BadRequest as exc:
            return error_response(400, str(exc))

        async def load():
            engine.load_weights(state, version)

        paused = await swap_between_requests(served.gate, load, version)
        return JSONResponse({"model": served.model_name, "policy_version": version,
                             "paused_seconds": round(paused, 4)})

    return endpoint

"""vLLM's own OpenAI-compatible server with the studio's weight sync added, for the `server` engine
(engines/server.py) on GPUs:

    python -m workers.rl.serving.vllm_server --model PATH [any `vllm serve` flag ...] [--policy-version N]

It runs vLLM's real entrypoint (its argument parser, engine, app and uvicorn setup: every vLLM flag works) and adds
to vLLM's app what the studio's CPU server (app.py) has and vLLM's has not, with the pieces they share
(weight_sync.py):

- `POST /v1/weights {"location": URL or directory, "policy_version": N}`: the same contract as app.py's. Auth:
  the bearer token in STUDIO_SERVE_WEIGHTS_TOKEN; without one, loopback clients only (with vLLM's `--api-key` set,
  vLLM checks that key on /v1/weights too, and the engine sends one token: make the two the same). The published
  directory (workers/storage) is brought to this host (`Storage.fetched`, held against cache eviction until the
  load is over) and its names and shapes are checked against the served checkpoint's before anything pauses. Then
  new completions wait while the ones in flight finish on the old weights; vLLM's engine is paused
  (`pause_generation(mode="wait")`: it waits for anything else in flight, e.g. /v1/responses, and refuses new
  work on the other routes with a retryable 503 meanwhile); every worker loads the weights into the running
  model; the prefix cache is reset (cached KV blocks were computed with the old weights); the version is recorded
  (ours and vLLM's own weight-version label); generation resumes and the held requests go in on the new weights.
  If the load fails after the pause, the model may be half updated: the engine stays paused and completions are
  refused (503) until a load succeeds.
- `GET /v1/weights`: `{"model", "policy_version"}`.
- every `/v1/completions` and `/v1/chat/completions` answer (JSON, or each server-sent chunk of a stream) gains a
  top-level `policy_version`: the version that sampled it (exact: a swap waits for every request in flight).

Names: the trainer publishes its model's state-dict names (policy.inference_state()); for a Hugging Face model
these are already the checkpoint names vLLM's `load_weights` expects (`model.layers.0.self_attn.q_proj.weight`,
...; vLLM maps them onto its fused/stacked parameters itself), LoRA adapters merged in and PEFT's prefixes
removed. `checkpoint_name` also strips PEFT's and torch.compile's wrapping if a trainer publishes them, and drops
adapter tensors. A tied `lm_head.weight` is published by the trainer and skipped by vLLM.

vLLM facilities relied on (read in vLLM 0.34.0's wheel, `vllm/_version.py`: 0.34.0, commit g62d4bc3c7):
- vllm/entrypoints/common/cli_args.py `make_arg_parser`, `validate_parsed_serve_args`; vllm/entrypoints/common/
  startup.py `cli_env_setup`; vllm/utils/argparse_utils.py `FlexibleArgumentParser`: vLLM's own parser and checks.
- vllm/entrypoints/launchers/api_server/entry.py `run_server` (single API process) → `build_and_serve`, which
  calls the module-level name `build_app` (vllm/entrypoints/launchers/app.py) then `init_app_state` (which sets
  `app.state.engine_client`): we wrap that one name so our route and middleware are added to the app vLLM built,
  and everything else (engine, app state, uvicorn, SSL, shutdown) is vLLM's. Endpoint plugins
  (vllm/plugins/endpoint_plugins) would need an installed entry point, and they are asked not to reach the engine.
- `--worker-extension-cls` (vllm/config/parallel.py `worker_extension_cls`, mixed into the worker class by
  vllm/v1/worker/worker_base.py) to give each worker `studio_load_weights`, called through the engine client's
  `collective_rpc` (vllm/v1/engine/async_llm.py): every tensor-parallel rank reads the file from this host's disk
  and loads the full tensors (vLLM's weight loaders shard them), rather than shipping gigabytes through the engine's
  RPC channel. In it, `Worker.reload_weights(weights_iterator=..., is_checkpoint_format=True)`
  (vllm/v1/worker/gpu_worker.py → model_executor/model_loader/reload/inplace.py): the model's `load_weights` with
  vLLM's reload bookkeeping (quantized/processed layers re-derived, LoRA, encoder and multimodal caches reset); the
  model's `load_weights` directly where a worker has no `reload_weights`. TRL's `trl vllm-serve` does the same
  through its own worker extension (`model_runner.model.load_weights`, then a prefix-cache reset).
- AsyncLLM `pause_generation(mode="wait")`, `resume_generation`, `reset_prefix_cache`, `update_weight_version`
  (vllm/engine/protocol.py EngineClient; the same calls as vLLM's RL routes /pause, /resume in
  vllm/entrypoints/rl/online/api_router.py). vLLM's own NCCL/IPC weight-transfer engines need a trainer that
  joins a process group with the server; the studio's trainer publishes to blob storage instead.

vLLM is imported only by `main` and inside the workers: this module imports (and its pure parts are tested) on
machines without it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import json
import logging
import os
import sys
from collections.abc import Awaitable, Callable, Iterable, Iterator
from pathlib import Path

from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.responses import JSONResponse

from workers.storage import Storage

from .weight_sync import (
    BadRequest,
    Gate,
    error_response,
    loading_refused,
    may_load,
    swap_between_requests,
    weights_request,
)

logger = logging.getLogger(__name__)

TOKEN_ENV = "STUDIO_SERVE_WEIGHTS_TOKEN"
WEIGHTS_FILE = "model.safetensors"
# Where a completion is admitted through the gate and answered with its policy_version.
GATED_PATHS = ("/v1/completions", "/v1/chat/completions")
# Literal, not f"{__name__}...": run with -m, this module's __name__ is "__main__", which vLLM's workers cannot import.
EXTENSION = "workers.rl.serving.vllm_server.StudioWorkerExtension"
# Defaults set on vLLM's parser (an explicit flag, or --config, still wins): logprobs of the distribution sampled
# from, as the trainer recomputes them; the worker extension that loads published weights.
VLLM_DEFAULTS = {"logprobs_mode": "processed_logprobs", "worker_extension_cls": EXTENSION}
# Checkpoint tensors a published state may lack: a tied head (vLLM skips it), rotary caches old checkpoints carry.
MAY_BE_ABSENT = ("lm_head.weight", "rotary_emb.inv_freq")


# --- names --------------------------------------------------------------------------------------------------------

def checkpoint_name(name: str) -> str | None:
    """The Hugging Face checkpoint name vLLM's `load_weights` expects for a tensor the trainer published, or None
    for one that is not the model's (a LoRA adapter's). The trainer publishes checkpoint names already
    (policy.inference_state: LoRA merged, PEFT's prefixes removed), so for it this is the identity; PEFT's
    (`base_model.model.`, `.base_layer`) and torch.compile's (`_orig_mod.`) wrapping is undone if present."""
    parts = name.split(".")
    if any(part.startswith("lora_") for part in parts):
        return None
    name = name.removeprefix("base_model.model.").removeprefix("_orig_mod.")
    return ".".join(part for part in name.split(".") if part not in ("base_layer", "_orig_mod"))


def checkpoint_names(names: Iterable[str]) -> dict[str, str]:
    """Published name → checkpoint name, adapter tensors left out (ValueError if two tensors map to one name)."""
    mapped: dict[str, str] = {}
    seen: dict[str, str] = {}
    for name in names:
        target = checkpoint_name(name)
        if target is None:
            continue
        if target in seen:
            raise ValueError(f"{seen[target]!r} and {name!r} are both {target!r}")
        seen[target] = mapped[name] = target
    return mapped


# --- shapes and the fit check ---------------------------------------------------------------------------------------

def safetensors_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    """Each tensor's shape in a safetensors file, from its header alone (8 bytes of length, then JSON)."""
    with open(path, "rb") as file:
        size = int.from_bytes(file.read(8), "little")
        if not 0 < size < 1 << 30:
            raise ValueError(f"{path} is not a safetensors file")
        header = json.loads(file.read(size))
    return {name: tuple(entry["shape"]) for name, entry in header.items() if name != "__metadata__"}


def checkpoint_shapes(model: str) -> dict[str, tuple[int, ...]] | None:
    """The served checkpoint's tensor shapes, when `model` is a local directory of safetensors files (None
    otherwise: then published weights are not checked before vLLM loads them)."""
    directory = Path(model)
    files = sorted(directory.glob("*.safetensors")) if directory.is_dir() else []
    if not files:
        return None
    shapes: dict[str, tuple[int, ...]] = {}
    for path in files:
        shapes.update(safetensors_shapes(path))
    return shapes


def check_fits(published: dict[str, tuple[int, ...]], served: dict[str, tuple[int, ...]] | None) -> None:
    """Refuses (BadRequest) published weights that are not the served model's under their checkpoint names:
    vLLM's loaders would fail half way through (a half-updated model) or silently skip unknown names."""
    try:
        mapped = {target: published[name] for name, target in checkpoint_names(published).items()}
    except ValueError as exc:
        raise BadRequest(f"the weights do not fit the served model: {exc}")
    if not mapped:
        raise BadRequest("the weights hold no tensor of the model")
    if served is None:
        return
    unexpected = [n for n in mapped if n not in served and not n.endswith(MAY_BE_ABSENT)]
    missing = [n for n in served if n not in mapped and not n.endswith(MAY_BE_ABSENT)]
    wrong = [n for n, shape in mapped.items() if n in served and tuple(shape) != tuple(served[n])]
    if unexpected or missing or wrong:
        raise BadRequest(f"the weights do not fit the served model: missing {missing[:3]}, unexpected "
                         f"{unexpected[:3]}, other shapes {wrong[:3]}")


# --- the served version, the gate, and the middleware -------------------------------------------------------------

class ServedWeights:
    """The version served and the gate completions pass (made on the server's event loop, at its first use), and
    why completions are refused after a failed load ("" when they are not)."""

    def __init__(self, version: int = 0, model_name: str = ""):
        self.initial, self.model_name = version, model_name
        self.broken = ""
        self._gate: Gate | None = None

    @property
    def gate(self) -> Gate:
        if self._gate is None:
            self._gate = Gate(self.initial)
        return self._gate

    @property
    def version(self) -> int:
        return self.gate.version


def _path(scope) -> str:
    return scope["path"].removeprefix(scope.get("root_path", "") or "")


def with_policy_version(body: bytes, version: int) -> bytes:
    """A JSON object's bytes with a top-level `policy_version`; anything else unchanged."""
    try:
        answer = json.loads(body)
    except ValueError:
        return body
    if not isinstance(answer, dict):
        return body
    answer["policy_version"] = version
    return json.dumps(answer, separators=(",", ":"), ensure_ascii=False).encode()


def with_policy_version_event(event: bytes, version: int) -> bytes:
    """One server-sent event (without its blank-line end) with `policy_version` in each JSON object of its data
    lines; `[DONE]` and comments unchanged."""
    lines = event.split(b"\n")
    for index, line in enumerate(lines):
        if line.startswith(b"data:") and line[5:].strip().startswith(b"{"):
            lines[index] = b"data: " + with_policy_version(line[5:].strip(), version)
    return b"\n".join(lines)


class PolicyVersionMiddleware:
    """Pure ASGI middleware (no FastAPI needed; a stream goes through as it is produced) around the app's completion
    routes: each request passes the gate (held while weights are swapped, counted in flight until its answer is
    sent), then its JSON answer, or each chunk of its stream, gets the version it ran on."""

    def __init__(self, app, *, weights: ServedWeights, paths: tuple[str, ...] = GATED_PATHS):
        self.app, self.weights, self.paths = app, weights, paths

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope.get("method") != "POST" or _path(scope) not in self.paths:
            await self.app(scope, receive, send)
            return
        gate = self.weights.gate
        await gate.enter()
        try:
            if self.weights.broken:
                await error_response(503, self.weights.broken, "service_unavailable")(scope, receive, send)
                return
            await self.app(scope, receive, _versioned(send, gate.version))
        finally:
            gate.leave()


def _versioned(send, version: int):
    """`send`, with `policy_version` written into a 200 answer of JSON (buffered, its length corrected) or into
    each event of a 200 event stream (as the events go out); any other answer unchanged."""
    state: dict = {"mode": None, "start": None, "body": bytearray()}

    async def versioned(message) -> None:
        if message["type"] == "http.response.start":
            headers = Headers(raw=message.get("headers", []))
            kind = headers.get("content-type", "")
            if message["status"] == 200 and not headers.get("content-encoding"):
                if kind.startswith("application/json"):
                    state["mode"], state["start"] = "json", message
                    return  # sent with the body, once its length is known
                if kind.startswith("text/event-stream"):
                    state["mode"] = "events"
            await send(message)
            return
        if message["type"] != "http.response.body" or state["mode"] is None:
            await send(message)
            return
        body: bytearray = state["body"]
        body += message.get("body", b"")
        more = message.get("more_body", False)
        if state["mode"] == "json":
            if more:
                return
            content = with_policy_version(bytes(body), version)
            start = state["start"]
            headers = [(k, v) for k, v in start.get("headers", []) if k.lower() != b"content-length"]
            await send({**start, "headers": [*headers, (b"content-length", str(len(content)).encode())]})
            await send({"type": "http.response.body", "body": content, "more_body": False})
            return
        out = bytearray()
        while (end := body.find(b"\n\n")) >= 0:
            out += with_policy_version_event(bytes(body[:end]), version) + b"\n\n"
            del body[:end + 2]
        if not more:
            out += body
            body.clear()
        if out or not more:
            await send({"type": "http.response.body", "body": bytes(out), "more_body": more})

    return versioned


# --- POST/GET /v1/weights ---------------------------------------------------------------------------------------------

Swap = Callable[[Path, int], Awaitable[None]]


@contextlib.contextmanager
def local_weights(location: str) -> Iterator[Path]:
    """The published weights directory at `location` on this host: an object store's, downloaded into this host's
    cache and held against eviction until the block ends (workers.storage); a local directory as it is."""
    if "://" in location:
        with Storage(location).fetched() as directory:
            yield directory
    else:
        yield Path(location)


def weights_endpoint(weights: ServedWeights, swap: Swap, *, token: str = "",
                     served: dict[str, tuple[int, ...]] | None = None):
    """The `/v1/weights` route: GET the version served; POST loads a published weights directory, `swap(directory,
    version)` doing the loading while no completion is in flight and none is admitted."""

    async def endpoint(request: Request):
        if request.method == "GET":
            return JSONResponse({"model": weights.model_name, "policy_version": weights.version})
        if not may_load(request.headers.get("authorization", ""), request.client.host if request.client else None,
                        token):
            return loading_refused(token)
        try:
            location, version = await weights_request(request)
            # Brought here before anything pauses: a download must not hold requests back.
            held = local_weights(location)
            try:
                directory = await asyncio.to_thread(held.__enter__)
            except (OSError, ValueError) as exc:
                raise BadRequest(f"could not read weights from {location}: {exc}") from None
        except BadRequest as exc:
            return error_response(400, str(exc))
        try:
            try:
                path = directory / WEIGHTS_FILE
                if not path.is_file():
                    raise BadRequest(f"{location} holds no {WEIGHTS_FILE}")
                try:
                    published = await asyncio.to_thread(safetensors_shapes, path)
                except (OSError, ValueError) as exc:
                    raise BadRequest(f"could not read weights from {location}: {exc}") from None
                check_fits(published, served)
            except BadRequest as exc:
                return error_response(400, str(exc))
            return await _swap(directory, version)
        finally:
            await asyncio.to_thread(held.__exit__, None, None, None)

    async def _swap(directory: Path, version: int):
        try:
            paused = await swap_between_requests(weights.gate, lambda: swap(directory, version), version)
        except Exception as exc:
            # Set before any held request runs (nothing awaits between the gate opening and here): they get 503.
            weights.broken = (f"loading the weights of version {version} failed ({type(exc).__name__}: {exc}); "
                              "this server refuses completions until a load succeeds")[:1000]
            logger.exception("loading weights of version %s from %s failed", version, directory)
            return error_response(500, weights.broken, "server_error")
        weights.broken = ""
        return JSONResponse({"model": weights.model_name, "policy_version": version,
                             "paused_seconds": round(paused, 4)})

    return endpoint


def install(app, *, weights: ServedWeights, swap: Swap, token: str = "",
            served: dict[str, tuple[int, ...]] | None = None) -> None:
    """Adds `/v1/weights` and the policy-version middleware to a Starlette (or FastAPI: vLLM's) app, before it
    starts. The middleware goes outermost: a request is held before any of the app's own middleware sees it."""
    app.add_route("/v1/weights", weights_endpoint(weights, swap, token=token, served=served), methods=["GET", "POST"])
    app.add_middleware(PolicyVersionMiddleware, weights=weights)


# --- inside vLLM ------------------------------------------------------------------------------------------------------

def published_tensors(path: Path) -> Iterator[tuple[str, object]]:
    """(checkpoint name, CPU tensor) of a published safetensors file, one tensor at a time (a worker holds one
    tensor, not the whole state, in host memory), adapter tensors left out."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt", device="cpu") as file:
        names = checkpoint_names(file.keys())
        for name, target in names.items():
            yield target, file.get_tensor(name)


class StudioWorkerExtension:
    """Mixed into each vLLM worker by `--worker-extension-cls` (vLLM's way to add `collective_rpc` methods)."""

    def studio_load_weights(self, directory: str) -> int:
        """Loads the published weights in `directory` into this worker's running model; returns how many tensors
        went in. vLLM's in-place reload where the worker has it (0.34: `Worker.reload_weights`), else the model's
        `load_weights`."""
        count = 0

        def weights():
            nonlocal count
            for item in published_tensors(Path(directory) / WEIGHTS_FILE):
                count += 1
                yield item

        reload = getattr(self, "reload_weights", None)
        if callable(reload):
            reload(weights_iterator=weights(), is_checkpoint_format=True)
        else:
            self.model_runner.model.load_weights(weights())
        return count


async def load_into_vllm(engine, directory: Path, version: int) -> None:
    """Swaps the weights in `directory` into the running vLLM engine (its EngineClient), nothing in flight on the
    gated routes. On failure the engine stays paused (the model may be half updated)."""
    # "wait": whatever else is in flight (other routes) finishes; new work elsewhere gets a retryable 503. An
    # in-process engine core (VLLM_ENABLE_V1_MULTIPROCESSING=0) has no "wait": "abort" there, which can only cut
    # requests on the ungated routes (the gated ones have drained).
    try:
        await engine.pause_generation(mode="wait")
    except ValueError as exc:
        logger.warning("vLLM cannot pause with mode 'wait' (%s): pausing with 'abort'", exc)
        await engine.pause_generation(mode="abort")
    loaded = await engine.collective_rpc("studio_load_weights", args=(str(directory),))
    if not loaded or not all(loaded):
        raise RuntimeError(f"the workers loaded {loaded} tensors")
    # The pause cleared the caches too; reset again after the load, where it matters: no KV block computed with
    # the old weights may be reused for a prompt under the new ones.
    if await engine.reset_prefix_cache() is False:
        raise RuntimeError("vLLM could not reset its prefix cache")
    try:  # vLLM's own label of the weights (its /weight_info, `return_weight_versions`): the same version
        await engine.update_weight_version(str(version))
    except (AttributeError, NotImplementedError) as exc:
        logger.warning("vLLM's weight version label not set: %s", exc)
    await engine.resume_generation()


# --- the launcher -----------------------------------------------------------------------------------------------------

def studio_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument("--policy-version", type=int, default=0,
                        help="the version of the weights served at start (default 0)")
    return parser


def split_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """Our flags, and the rest for vLLM's parser (which keeps its own flags' forms: --x=v, --x_y, -h)."""
    studio, rest = studio_parser().parse_known_args(argv)
    if studio.policy_version < 0:
        raise SystemExit("--policy-version must be 0 or more")
    return studio, rest


def check_extension(qualname: str) -> None:
    """The worker extension must be ours or a subclass of it: /v1/weights calls its `studio_load_weights`."""
    if qualname == EXTENSION:
        return
    module, _, name = qualname.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError) as exc:
        raise SystemExit(f"--worker-extension-cls {qualname}: {exc}") from None
    if not (isinstance(cls, type) and issubclass(cls, StudioWorkerExtension)):
        raise SystemExit(f"--worker-extension-cls {qualname} must be {EXTENSION} or a subclass of it "
                         "(/v1/weights loads through it)")


def served_model_name(args) -> str:
    names = getattr(args, "served_model_name", None)
    return (names[0] if isinstance(names, list | tuple) and names else names) or args.model


def vllm_args(rest: list[str]):
    """vLLM's `serve` arguments, parsed and checked by vLLM's own parser, with our defaults."""
    from vllm.entrypoints.common.cli_args import make_arg_parser, validate_parsed_serve_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = make_arg_parser(FlexibleArgumentParser(
        prog="python -m workers.rl.serving.vllm_server",
        description="vLLM's OpenAI-compatible server with the studio's /v1/weights and policy_version "
                    "(also: --policy-version N, the version served at start)."))
    parser.set_defaults(**VLLM_DEFAULTS)
    args = parser.parse_args(rest)
    if getattr(args, "model_tag", None):
        args.model = args.model_tag  # as `vllm serve MODEL` does
    validate_parsed_serve_args(args)
    if getattr(args, "headless", False) or (getattr(args, "api_server_count", None) or 1) != 1 \
            or getattr(args, "grpc", False):
        raise SystemExit("workers.rl.serving.vllm_server runs one HTTP API server process (no --headless, --grpc or "
                         "--api-server-count > 1): the weight gate and version live in it")
    check_extension(args.worker_extension_cls)
    return args


def main(argv: list[str] | None = None) -> None:
    studio, rest = split_args(sys.argv[1:] if argv is None else argv)
    try:
        from vllm.entrypoints.launchers.api_server import entry
    except ImportError as exc:
        raise SystemExit(f"workers.rl.serving.vllm_server needs vLLM 0.34 (GPU workers install requirements/gpu.txt; "
                         f"it is not part of the CPU environment): {exc}") from None
    import uvloop  # vLLM's dependency; its entrypoint runs on it too
    from vllm.entrypoints.common.startup import cli_env_setup
    from vllm.logger import configure_logging_from_args

    cli_env_setup()  # as vLLM's own entrypoint: spawn for the workers
    args = vllm_args(rest)
    configure_logging_from_args(args)
    token = os.environ.get(TOKEN_ENV, "")
    weights = ServedWeights(studio.policy_version, served_model_name(args))
    served = checkpoint_shapes(args.model)
    if served is None:
        logger.warning("%s is not a local directory of safetensors: published weights are not checked against it",
                       args.model)
    vllm_build_app = entry.build_app

    def build_app(*a, **kw):
        app = vllm_build_app(*a, **kw)
        install(app, weights=weights, token=token, served=served,
                swap=lambda directory, version: load_into_vllm(app.state.engine_client, directory, version))
        return app

    entry.build_app = build_app  # build_and_serve looks the name up when it builds the app
    uvloop.run(entry.run_server(args))


if __name__ == "__main__":
    main()

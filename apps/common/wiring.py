"""The composition root: the one place where settings become engine objects.

The engine (workers/) reads no settings; whatever it needs from them — a sandbox pool on the configured
backend, the judge client with its cache and prices, what compute costs, the runners that execute tool calls
and verifications here or on other workers, the storage its blobs go to — is built here, and every other part
of the studio (run attempts, the reference check, the Celery tasks, the operator commands, the benchmarks) asks
for it here.
"""

from __future__ import annotations

import atexit
import hashlib
import threading
from pathlib import Path

from django.conf import settings

from workers.egress import EgressPolicy, EgressRefused
from workers.rl.config import GRPOConfig, PolicyConfig, SandboxConfig
from workers.rl.models.packaged import (
    PACKAGED_MODELS,
    TRAINABLE_BUILTINS,
    ModelUnavailable,
    cache_directory,
    converted,
    gguf_file,
)
from workers.rl.protocols import Model, ToolRunner, Verifier
from workers.rl.rollout.grading import LocalVerifier
from workers.rl.rollout.metrics import Prices
from workers.rl.rollout.tools import SandboxToolRunner
from workers.rl.tasks.taskset import TaskSet
from workers.sandbox import SandboxImage, SandboxPool
from workers.sandbox.backends import backend_named
from workers.sandbox.interface import SandboxBackend
from workers.storage import Storage
from workers.verifiers import Context


def sandbox_backend(name: str | None = None) -> SandboxBackend:
    """The sandbox backend `name` (default: settings.SANDBOX_BACKEND) over this machine's shared directories."""
    return backend_named(name or settings.SANDBOX_BACKEND, layer_cache=settings.SANDBOX_LAYER_CACHE,
                         docker_control=settings.SANDBOX_DOCKER_CONTROL, network_allowed=settings.SANDBOX_NETWORK)


def sandbox_pool(*, backend: str | None = None, session_ceiling: int | None = None) -> SandboxPool:
    """A new pool on `backend` (default: settings.SANDBOX_BACKEND); the caller closes it. It publishes its
    state for `manage.py sandbox pool-status`. `session_ceiling`: the sessions of one prepared workspace it holds at
    once (default: the pool's own, a GRPO group's worth; the environment server holds as many as it serves)."""
    options = {} if session_ceiling is None else {"session_ceiling": session_ceiling}
    return SandboxPool(sandbox_backend(backend), status_dir=settings.SANDBOX_STATUS_DIR, **options)


_shared_pool: tuple[tuple, SandboxPool] | None = None  # (the settings it was made with, the pool)
_shared_pool_lock = threading.Lock()


def shared_sandbox_pool() -> SandboxPool:
    """This process's pool, made on first use and kept warm for the requests that try one thing in a sandbox (the
    playgrounds): each borrows its warm sandboxes instead of starting a pool of its own, whose every sandbox
    starts cold (52-78 s a playground request beside the demo's training run, for a check of 9-16 s). Callers never
    close it; the process does as it exits. Settings that make another pool (the backend, the status directory:
    each test has its own) replace it, and the one they replace is closed."""
    global _shared_pool
    made_with = (settings.SANDBOX_BACKEND, settings.SANDBOX_LAYER_CACHE, settings.SANDBOX_DOCKER_CONTROL,
                 settings.SANDBOX_NETWORK, settings.SANDBOX_STATUS_DIR)
    replaced = None
    with _shared_pool_lock:
        if _shared_pool is None or _shared_pool[0] != made_with:
            replaced, _shared_pool = _shared_pool, (made_with, sandbox_pool())
        pool = _shared_pool[1]
    if replaced is not None:
        replaced[1].close()
    return pool


@atexit.register
def _close_shared_sandbox_pool() -> None:
    with _shared_pool_lock:
        shared = _shared_pool
    if shared is not None:
        shared[1].close()


def egress_policy() -> EgressPolicy:
    """Where a request a user aimed may go: public addresses, and what the operator allowed (STUDIO_EGRESS_ALLOW)."""
    return EgressPolicy.parse(settings.EGRESS_ALLOW)


def inference_servers_problem(urls: list[str]) -> str:
    """Why a run may not generate on the inference servers at `urls` (empty when it may): they receive the run's
    weights and the weight token, so each must be one the operator listed in STUDIO_EGRESS_ALLOW."""
    policy = egress_policy()
    for url in urls:
        try:
            policy.check_url(url, listed_only=True)
        except EgressRefused as exc:
            return (f"{url}: {exc}; inference servers receive the run's weights and the studio's weight token, so "
                    "the operator lists each one")
    return ""


def judge_client():
    """The judge layer's client (any OpenAI-compatible endpoint), or None without JUDGE_BASE_URL: judge checks
    then report infra_error, never a reward."""
    if not settings.JUDGE_BASE_URL:
        return None
    from workers.verifiers.judge import InMemoryJudgeCache, JudgeClient, RedisJudgeCache

    return JudgeClient(settings.JUDGE_BASE_URL, settings.JUDGE_API_KEY or "none",
                       timeout_seconds=settings.JUDGE_TIMEOUT_SECONDS, max_concurrency=settings.JUDGE_MAX_CONCURRENCY,
                       cache=RedisJudgeCache(settings.REDIS_URL) if settings.REDIS_URL else InMemoryJudgeCache(),
                       price_per_1k_input_tokens=settings.JUDGE_PRICE_PER_1K_INPUT_TOKENS,
                       price_per_1k_output_tokens=settings.JUDGE_PRICE_PER_1K_OUTPUT_TOKENS)


def prices() -> Prices:
    return Prices(gpu_per_hour=settings.GPU_PRICE_PER_HOUR, sandbox_cpu_per_hour=settings.SANDBOX_CPU_PRICE_PER_HOUR)


def verification_context(*, pool: SandboxPool | None, image: SandboxImage | None) -> Context:
    """What verifying against one image needs: the pool, the image and the judge."""
    return Context(pool=pool, image=image, judge=judge_client())


def local_runners(pool: SandboxPool, config: SandboxConfig) -> tuple[SandboxToolRunner, LocalVerifier]:
    """Tool calls and verifications in this process, over `pool`."""
    return (SandboxToolRunner(pool, max_output_chars=config.max_tool_output_chars),
            LocalVerifier(pool, judge_client()))


def run_runners(pool: SandboxPool, config: GRPOConfig) -> tuple[ToolRunner, Verifier]:
    """A training run's tool runner and verifier: on the `rollout` and `verify` queues when the studio runs on
    services with REMOTE_ROLLOUTS on, else in this process over `pool`."""
    if settings.REMOTE_ROLLOUTS:
        from workers.remote import RemoteToolRunner, RemoteVerifier

        app, timeout = celery_app(), settings.REMOTE_TIMEOUT_SECONDS
        return (RemoteToolRunner(app, max_output_chars=config.max_tool_output_chars, timeout=timeout),
                RemoteVerifier(app, timeout=timeout))
    return local_runners(pool, config)


def celery_app():
    """The studio's Celery app (studio/celery.py), which sends tasks by name to the queues its routes name.
    The one import of the project package from an app (the import contract names it): this module is where the
    whole studio is wired."""
    from studio.celery import app

    return app


def blob_storage() -> Storage:
    """Where blobs live (checkpoints, artifacts, converted models): settings.STORAGE_URL, an S3-compatible bucket
    every host shares, or by default the data directory. What this host downloads is cached under
    DATA_DIR/cache."""
    return Storage(settings.STORAGE_URL or settings.DATA_DIR, cache=Path(settings.DATA_DIR) / "cache",
                   cache_bytes=settings.STORAGE_CACHE_BYTES, outage_seconds=settings.STORAGE_OUTAGE_SECONDS)


def checkpoint_dir(run_id) -> Storage:
    """A run's checkpoints (workers/rl/training/checkpoint.py): `checkpoints/<run id>/` in the blob storage."""
    return blob_storage().child(f"checkpoints/{run_id}")


def stored_directory(location: str) -> Path:
    """A local directory holding the published directory at `location` (a local path, or an object store's URL
    as a checkpoint row records it): the directory itself, or this host's cached download of it.
    FileNotFoundError if it is gone."""
    if "://" not in location:
        return Storage(location).fetch()
    digest = hashlib.sha256(location.encode()).hexdigest()[:16]
    return Storage(location, cache=Path(settings.DATA_DIR) / "cache" / "by-location" / digest).fetch()


def models_dir() -> Path:
    """Where built-in base models are cached (pretrained once per corpus, converted once per file)."""
    return Path(settings.DATA_DIR) / "models"


def shared_models() -> Storage | None:
    """Where a host publishes the base models it built and the others fetch them (instead of building their
    own): `models/` in the blob storage when that is an object store; None when it is the data directory, which
    already holds models_dir()."""
    storage = blob_storage()
    return None if storage.local else storage.child("models")


def packaged_model(model: str) -> Path:
    """The converted directory of a packaged model (workers/rl/models/packaged.py), converting it if needed."""
    return converted(PACKAGED_MODELS[model], models_dir(), shared=shared_models())


def model_directory(model: str) -> Path | None:
    """The local Hugging Face directory of a run's model if this machine has it — a packaged model only once
    converted (a page never converts) — or None."""
    if model in PACKAGED_MODELS:
        try:
            directory = cache_directory(PACKAGED_MODELS[model], models_dir())
        except ModelUnavailable:
            return None
        return directory if (directory / "source.json").is_file() else None
    path = Path(model) if model and not model.startswith("builtin:") and "\x00" not in model else None
    return path if path is not None and path.is_dir() else None


def model_problem(model: str) -> str | None:
    """Why a run may not use `model`, or None: a built-in name, or a Hugging Face model directory (with its
    config.json) inside settings.MODEL_DIRS — never an arbitrary path of the worker's file system."""
    if model.startswith("builtin:"):
        if model in PACKAGED_MODELS:
            try:
                gguf_file(PACKAGED_MODELS[model])
            except ModelUnavailable as exc:
                return str(exc)
        elif model not in TRAINABLE_BUILTINS:
            return f"unknown built-in model {model!r}; the built-in ones are " + ", ".join(TRAINABLE_BUILTINS)
        return None
    if "\x00" in model:  # no file system takes it (Path.resolve raises ValueError)
        return f"model {model!r} holds a NUL character: not a path"
    path = Path(model)
    roots = [Path(root).resolve() for root in settings.MODEL_DIRS]
    if not path.is_absolute() or not any(path.resolve().is_relative_to(root) for root in roots):
        return (f"model {model!r} is neither built in nor a directory inside the model directories "
                f"({', '.join(map(str, roots))}; STUDIO_MODEL_DIRS sets them)")
    if not (path / "config.json").is_file():
        return f"model {model!r} has no config.json: not a Hugging Face model directory"
    return None


def weights_storage(run_id) -> Storage:
    """Where a run that generates on inference servers publishes its weights for them to load after each step:
    `weights/<run id>/` in the blob storage (servers on other hosts need it to be an object store)."""
    return blob_storage().child(f"weights/{run_id}")


def run_model(config: PolicyConfig, tasks: TaskSet | None, *, dataset_file: str = "", progress=None, run_id=None,
              sampling: bool = True) -> Model:
    """The run's model (policy, engine, chat format) on the device its config asks for; `tasks`, or without them
    the conversations of `dataset_file` (an SFT or DPO run's dataset, alone), are what the built-in demo model is
    pretrained on. A GRPO run (`run_id`) with inference_servers in its config generates on those servers; anything
    else samples in this process (its config a RolloutConfig), unless it samples nothing (`sampling` False: SFT and
    DPO, no engine)."""
    from workers.rl.models import build  # torch: only where a model is built, not in rollout and verify workers

    on_servers = run_id is not None and isinstance(config, GRPOConfig) and config.inference_servers
    weights = weights_storage(run_id) if on_servers else None
    return build.build_model(config, _demo_corpus(config.model, tasks, dataset_file), models_dir=models_dir(),
                             pretrain_seconds=settings.DEMO_PRETRAIN_SECONDS, progress=progress,
                             shared=shared_models(), weights=weights, server_token=settings.INFERENCE_SERVER_TOKEN,
                             egress=egress_policy(), sampling=sampling)


def _demo_corpus(model: str, tasks: TaskSet | None, dataset_file: str):
    """What the built-in demo model is pretrained on: the tasks' reference answers, or, for an SFT or DPO run
    without tasks, its dataset's conversations. None for any other model, which reads neither."""
    from workers.rl.models import build
    from workers.rl.training.data_files import dataset_corpus

    if model != build.DEMO_MODEL:
        return None
    if tasks is not None:
        return build.demo_corpus(tasks)
    return dataset_corpus(dataset_file) if dataset_file else None


def demo_base_model(tasks: TaskSet, *, progress=None) -> Path:
    """The built-in demo base model for these tasks, pretrained now if it is not cached yet."""
    from workers.rl.models import build

    return build.demo_base_model(build.demo_corpus(tasks), models_dir=models_dir(),
                                 pretrain_seconds=settings.DEMO_PRETRAIN_SECONDS, progress=progress,
                                 shared=shared_models())

"""The `server` engine: rollouts generated on one or more OpenAI-compatible inference servers — the studio's own
`manage.py serve` on CPUs (workers/rl/serving/app.py), or vLLM's server on GPUs — while the trainer runs here.

Each request goes to `/v1/completions` as token ids (`prompt` a list of ids, `stop_token_ids`,
`return_token_ids`, `logprobs: 0`: vLLM's names), to the server with the fewest requests in flight from this
engine (ties: round robin). The answer's `token_ids` and `logprobs.token_logprobs` become the Completion the
trainer needs, its `policy_version` the version that sampled it.

Weight sync (`load_weights`, which the pipeline calls after every trainer step): the policy's weights are
published to the blob storage as `<weights>/v-<version>/model.safetensors` (a published directory:
workers/storage), then every server is told to load them (`POST /v1/weights`); the servers swap them in between
requests. The two newest versions are kept in the storage (the run's whole folder goes when it ends). A server
that fails to load them is left out of the rotation until a later sync reaches it; if none takes them, the sync
fails. The bearer token, if set, goes with every request: the weight route needs it, and a server started with
an API key (vLLM's `--api-key`, serve's `api_token`) needs it for generation too.

Staleness, as the pipeline enforces it (collectors.too_stale): a completion whose `policy_version` lags the
version last synced by more than `max_staleness` is refused and asked again (of another server if there is one);
still too old after the retries, it comes back as a completion with finish_reason "error", which the agent
records as an infrastructure error, never trained on. `stale_refused` counts them. A server that does not say
which version answered (vLLM's plain `vllm serve`) is taken at the version last
synced to it.

For vLLM: run `python -m workers.rl.serving.vllm_server --model DIR [vLLM's flags]` (workers/rl/serving/vllm_server.py,
docs/VLLM.md): vLLM's own OpenAI-compatible server with the studio's `POST/GET /v1/weights` (the published
directory checked against the served checkpoint, then loaded into the running model between requests, the prefix
cache reset) and a top-level `policy_version` on every completion, started with `--logprobs-mode
processed_logprobs` by default (the logprobs of the distribution sampled from, as the trainer recomputes them).
With vLLM's `--api-key` set, give it the engine's token (one token serves both). The servers must read the
storage the weights are published to (an object store every host reaches, or a directory on the same host).

The servers receive the run's weights and the studio's weight token, and a run's config names them (an editor's
words): each must be one the operator listed in the egress policy (workers/egress.py, STUDIO_EGRESS_ALLOW) —
public is not enough — checked when the engine is built and on every connection; redirects are not followed.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx2

from workers.egress import PUBLIC_ONLY, EgressPolicy, EgressRefused, egress_client
from workers.storage import Storage

from . import Completion, GenerationRequest

KEEP_VERSIONS = 2


class ServerError(RuntimeError):
    pass


class ServerEngine:
    """`generate` and `load_weights` as the pipeline calls them, on inference servers at `urls` (their base URLs,
    ending in /v1)."""

    name = "server"
    shares_weights = False

    def __init__(self, urls: list[str], *, weights: Storage | None = None, token: str = "", model: str | None = None,
                 max_staleness: int = 1, policy_version: int = 0, max_context: int | None = None,
                 timeout_seconds: float = 600.0, retries: int = 2, max_concurrency: int = 64,
                 egress: EgressPolicy | None = PUBLIC_ONLY):
        """`egress`: the policy the servers are held to; None only for servers the studio itself started (the
        ranks engine's followers), never for URLs a run's config names."""
        if not urls:
            raise ValueError("the server engine needs at least one inference server")
        self.urls = [url.rstrip("/") for url in urls]
        for url in self.urls if egress is not None else ():
            try:
                egress.check_url(url, listed_only=True)
            except EgressRefused as exc:
                raise EgressRefused(f"inference server {url}: {exc} (inference servers receive the run's weights "
                                    f"and the studio's weight token: the operator lists each one)") from None
        connections = max_concurrency + len(self.urls)
        self._http = (httpx2.Client(timeout=timeout_seconds, trust_env=False, limits=httpx2.Limits(
            max_connections=connections, max_keepalive_connections=connections)) if egress is None else
            egress_client(egress, listed_only=True, max_connections=connections, timeout=timeout_seconds))
        self.weights, self.token, self.model = weights, token, model
        self.max_staleness, self.policy_version, self.max_context = max_staleness, policy_version, max_context
        self.timeout, self.retries = timeout_seconds, retries
        self.busy_seconds = 0.0
        self.stale_refused = 0  # completions refused as older than the staleness bound
        self.synced = {url: policy_version for url in self.urls}  # the version each server was last told to load
        self.lagging: set[str] = set()  # servers that failed the last sync: out of the rotation
        self._load = {url: 0 for url in self.urls}  # requests in flight, per server
        self._turn = 0
        self._lock = threading.Lock()
        self._threads = ThreadPoolExecutor(max_workers=max_concurrency, thread_name_prefix="server-engine")
        self._published: list[str] = []

    # --- HTTP ------------------------------------------------------------------------------------------------

    def _post(self, url: str, body: dict, *, token: str = "") -> dict:
        headers = {"Content-Type": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        try:
            reply = self._http.post(url, json=body, headers=headers)
            if reply.status_code >= 300:  # a redirect too: never followed
                raise ServerError(f"{url}: HTTP {reply.status_code}: {reply.text[:500]}")
            return reply.json()
        except (httpx2.HTTPError, OSError, ValueError) as exc:  # EgressRefused: a name that now resolves elsewhere
            raise ServerError(f"{url}: {type(exc).__name__}: {exc}") from None

    # --- generation ------------------------------------------------------------------------------------------

    def _pick(self, avoid: str | None) -> str:
        """The server with the fewest requests in flight (ties: round robin), `avoid` only if it is the only one."""
        with self._lock:
            live = [url for url in self.urls if url not in self.lagging] or list(self.urls)
            if avoid in live and len(live) > 1:
                live.remove(avoid)
            self._turn += 1
            order = live[self._turn % len(live):] + live[:self._turn % len(live)]
            url = min(order, key=lambda u: self._load[u])
            self._load[url] += 1
            return url

    def generate(self, requests: list[GenerationRequest]) -> list[list[Completion]]:
        """One list of `request.n` completions per request."""
        return list(self._threads.map(self._complete, requests))

    def _complete(self, request: GenerationRequest) -> list[Completion]:
        body = {"prompt": list(request.prompt_ids), "n": request.n, "max_tokens": max(1, request.max_new_tokens),
                "temperature": request.temperature, "stop_token_ids": list(request.stop_ids), "logprobs": 0,
                "return_token_ids": True, "skip_special_tokens": False}
        if self.model:
            body["model"] = self.model
        if request.seed is not None:
            body["seed"] = request.seed
        error, url = "", None
        for _ in range(1 + self.retries):
            url = self._pick(avoid=url)
            started = time.monotonic()
            try:
                completions = self._ask(url, request, body)
            except (ServerError, KeyError, TypeError, ValueError) as exc:
                error = f"{type(exc).__name__}: {exc}"[:500]
                continue
            finally:
                with self._lock:
                    self._load[url] -= 1
            seconds = time.monotonic() - started
            with self._lock:
                self.busy_seconds += seconds
            version = min(c.policy_version for c in completions)
            if self.policy_version - version > self.max_staleness:
                with self._lock:
                    self.stale_refused += 1
                error = (f"stale: {url} answered with policy version {version}, more than {self.max_staleness} "
                         f"behind version {self.policy_version}")
                continue
            total = max(1, sum(len(c.token_ids) for c in completions))
            for completion in completions:
                completion.compute_seconds = seconds * len(completion.token_ids) / total
            return completions
        return [Completion(token_ids=[], logprobs=[], finish_reason="error", error=error,
                           policy_version=self.policy_version) for _ in range(request.n)]

    def _ask(self, url: str, request: GenerationRequest, body: dict) -> list[Completion]:
        """The completions of one request from the server at `url` (ServerError, or ValueError for an answer that
        is not one). With a token, every request carries it (vLLM's `--api-key` guards /v1/completions too)."""
        answer = self._post(f"{url}/completions", body, token=self.token)
        return self._completions(answer, request, default_version=self.synced[url])

    @staticmethod
    def _completions(answer: dict, request: GenerationRequest, *, default_version: int) -> list[Completion]:
        """An answer of /v1/completions as the engine's completions (ValueError if it is not one)."""
        choices = sorted(answer["choices"], key=lambda c: c["index"])
        if len(choices) != request.n:
            raise ValueError(f"asked for {request.n} answers, got {len(choices)}")
        version = answer.get("policy_version")
        version = default_version if version is None else int(version)
        out = []
        for choice in choices:
            ids = [int(t) for t in choice["token_ids"]]
            logprobs = [float(x) for x in (choice.get("logprobs") or {}).get("token_logprobs") or []]
            if len(logprobs) != len(ids):
                raise ValueError(f"{len(ids)} token ids but {len(logprobs)} logprobs")
            finish = "length" if choice.get("finish_reason") == "length" else "stop"
            out.append(Completion(ids, logprobs, finish, policy_version=version))
        return out

    # --- weights ---------------------------------------------------------------------------------------------

    def load_weights(self, state: dict | None, version: int) -> None:
        """The pipeline's weight sync: publish `state` (the trainer's weights, names as in its model) to the
        weights storage, then have every server load it."""
        if state is None:
            raise RuntimeError("the server engine cannot share the trainer's model: it needs the weights")
        if self.weights is None:
            raise RuntimeError("the server engine has no storage to publish weights to")
        from safetensors.torch import save_file

        key = f"v-{version:06d}"
        staging = self.weights.stage(key)
        # Each tensor its own contiguous CPU copy: tied weights share memory, which safetensors refuses.
        save_file({k: v.detach().to("cpu").contiguous().clone() for k, v in state.items()},
                  str(staging / "model.safetensors"))
        self.weights.publish(key, staging, policy_version=version)
        self.sync_weights(self.weights.url_of(key), version)
        if key in self._published:
            self._published.remove(key)
        self._published.append(key)
        for old in self._published[:-KEEP_VERSIONS]:
            self.weights.unpublish(old)
        self._published = self._published[-KEEP_VERSIONS:]

    def sync_weights(self, location: str, version: int) -> None:
        """Every server loads the published weights directory at `location` as `version` (in parallel). From
        now on, answers older than `version - max_staleness` are refused."""
        def one(url: str) -> str:
            try:
                self._post(f"{url}/weights", {"location": location, "policy_version": version}, token=self.token)
            except ServerError as exc:
                return str(exc)
            return ""

        # Threads of its own: the generation pool may be full of rollouts waiting on these servers.
        with ThreadPoolExecutor(max_workers=len(self.urls), thread_name_prefix="server-sync") as threads:
            problems = dict(zip(self.urls, threads.map(one, self.urls), strict=True))
        with self._lock:
            for url, problem in problems.items():
                if problem:
                    self.lagging.add(url)
                else:
                    self.lagging.discard(url)
                    self.synced[url] = version
            if all(problems.values()):
                raise ServerError(f"no inference server loaded the weights of version {version}: "
                                  + "; ".join(problems.values()))
            self.policy_version = version

    def close(self) -> None:
        self._threads.shutdown(wait=False, cancel_futures=True)
        self._http.close()

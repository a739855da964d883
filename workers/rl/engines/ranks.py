"""The `ranks` engine: rank 0's generation under torchrun, spread over every rank's replica of the policy.

Each follower rank (workers/rl/training/distributed.py) samples with its own engine over its own replica — the same kind
as rank 0's, on its own device — served by the studio's OpenAI-compatible app (serving/) on a port of its host,
behind a bearer token rank 0 made for the run. Rank 0 keeps its own engine and asks it directly. A request goes
to whichever rank has the fewest requests in flight from here (ServerEngine's rotation, with rank 0's engine as
one more server), so a slow rank gets less work; a rank that fails a request is retried elsewhere.

Weights need no transfer: after every update all replicas hold the same weights (the gradients are all-reduced),
and each follower hands its own engine the new weights before the step's end (a barrier on the control group
makes sure of it: distributed.LeaderTrainer.train). `load_weights` here only passes them to rank 0's engine and
records the version; every answer still carries the version that sampled it, and the staleness bound is checked
on it as for any inference server.
"""

from __future__ import annotations

import logging

from . import Completion, GenerationRequest
from .server import ServerEngine, ServerError

LOCAL = "rank-0"  # rank 0's own engine, among the followers' URLs
log = logging.getLogger(__name__)


class RanksEngine(ServerEngine):
    name = "ranks"

    def __init__(self, local, follower_urls: list[str], *, token: str, max_staleness: int, max_concurrency: int):
        super().__init__([LOCAL, *follower_urls], token=token, max_staleness=max_staleness,
                         policy_version=local.policy_version, max_context=local.max_context,
                         max_concurrency=max_concurrency, egress=None)  # the followers are the run's own
        self.local = local
        self.shares_weights = local.shares_weights
        self.answered = {url: 0 for url in self.urls}  # completions each rank sampled

    def _ask(self, url: str, request: GenerationRequest, body: dict) -> list[Completion]:
        if url == LOCAL:
            try:
                completions = self.local.generate([request])[0]
            except Exception as exc:  # the engine's own failure: another rank may still answer
                raise ServerError(f"rank 0: {type(exc).__name__}: {exc}") from exc
        else:
            completions = super()._ask(url, request, body)
        with self._lock:
            self.answered[url] += len(completions)
        return completions

    def load_weights(self, state: dict | None, version: int) -> None:
        """Rank 0's engine takes the new weights; the followers' engines already have them."""
        self.local.load_weights(state, version)
        with self._lock:
            for url in self.urls:
                self.synced[url] = version
            self.lagging.clear()
            self.policy_version = version

    def completions_by_rank(self) -> dict[str, int]:
        return {("rank-0" if url == LOCAL else f"rank-{index}"): count
                for index, (url, count) in enumerate(self.answered.items())}

    def close(self) -> None:
        """Stops asking; rank 0's engine is its owner's to close."""
        log.info("completions sampled by rank: %s", self.completions_by_rank())
        super().close()

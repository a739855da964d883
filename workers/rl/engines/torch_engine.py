"""The `torch` engine: the project's TinyLM (models/tiny_lm.py) sampling with its KV cache, on the CPU or a GPU.

The model opens its own continuous batch (`TinyLM.continuous_batch`: its step and its cache's layout), so this
engine imports no model: the engines sit below the models, which build them (models/build.py)."""

from __future__ import annotations

import copy

from . import BatchingEngine, GenerationRequest
from .sampling import ContinuousBatch, SamplingRequest, sampling_request
from .speculation import OFF, Speculation

# Off by default: on 2 CPU cores it did not pay (engines/speculation.py says what was measured).
TORCH_SPECULATION = OFF


class TorchEngine(BatchingEngine):
    name = "torch"

    def __init__(self, model, *, device: str = "cpu", policy_version: int = 0, max_batch_rows: int = 512,
                 share: bool = False, speculation: Speculation | None = None):
        """`model`: a TinyLM. `share`: sample from `model` itself (the trainer's, in a sync run, where sampling and
        training never overlap); otherwise from a copy, which the trainer's updates reach through load_weights.
        `speculation`: drafts from the context (engines/speculation.py; None: the default, TORCH_SPECULATION)."""
        self.shares_weights = share
        self.speculation = TORCH_SPECULATION if speculation is None else speculation
        self.model = (model if share else copy.deepcopy(model)).to(device).eval()
        self.device = device
        self.max_context = model.config.block_size
        super().__init__(policy_version=policy_version, max_batch_rows=max_batch_rows)

    def _open_batch(self) -> ContinuousBatch:
        return self.model.continuous_batch(context=self.max_context, device=self.device,
                                           speculation=self.speculation, stats=self.speculation_stats)

    def _sampling_request(self, request: GenerationRequest) -> SamplingRequest:
        return sampling_request(request)

    def _load(self, state: dict | None) -> None:
        if state is None:  # the trainer's own model, updated in place; it left it in training mode
            self.model.eval()
            return
        self.model.load_state_dict(state)

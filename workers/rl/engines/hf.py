"""The `transformers` engine: any Hugging Face causal LM from a local path, batching continuously with its KV
cache (engines.sampling.ContinuousBatch, as the torch engine does).

The sampling loop is ours rather than `model.generate`: a model's generation_config often carries top_k, top_p
or a repetition penalty, and the logprobs GRPO needs must be those of the distribution the tokens were really
drawn from — softmax(logits / temperature), exactly what the trainer recomputes. `generate` also runs one
batch to its longest row; here requests join and leave between two tokens. Only the last position's logits
are computed (`logits_to_keep=1`): a prefill of 100 prompts of 400 tokens over a 49k vocabulary would
otherwise hold 8 GB of logits it never reads.

A prefill runs with transformers' own DynamicCache, whose keys and values ContinuousBatch writes into its slot
cache (slot_cache.py); a decode step hands the model that SlotCache as its cache (attention calls its `update`,
as it would a transformers Cache's) and a ready 4-D mask, which transformers uses as it is: no mask built per
step, no cache grown by concatenation.
"""

from __future__ import annotations

from pathlib import Path

import torch

from . import BatchingEngine, GenerationRequest, grouped_attention
from .decode_graphs import for_device
from .sampling import ContinuousBatch, SamplingRequest, sampling_request
from .speculation import OFF, Speculation

# Off by default: on 2 CPU cores it does not pay at any batch (engines/speculation.py says what was measured).
TRANSFORMERS_SPECULATION = OFF


class TransformersEngine(BatchingEngine):
    name = "transformers"

    def __init__(self, path: str, *, device: str = "cpu", policy_version: int = 0, dtype=torch.float32,
                 max_batch_rows: int = 512, shared_model=None, keep_prompts: bool = True,
                 cuda_graphs: bool | None = None, speculation: Speculation | None = None):
        """`shared_model`: the trainer's own model, sampled from as it is (a PeftModel too, its adapters
        unmerged) — only where sampling and training never overlap (a sync run). Otherwise the engine loads a
        copy of its own from `path`, which the trainer's updates reach through load_weights. `keep_prompts`:
        reuse earlier prompts' keys and values (prefix_cache.py); off only to measure what that saves.
        `cuda_graphs`: decode steps recorded and replayed as CUDA graphs (decode_graphs.py); None: on a CUDA
        device. Off to measure what they save, or for a model whose forward pass cannot be recorded (which the
        engine also finds itself, and then decodes eagerly). On a CPU, True pads the steps' rows as for a graph
        and decodes them eagerly. `speculation`: drafts from the context verified in one pass
        (engines/speculation.py; None: the default, TRANSFORMERS_SPECULATION, off)."""
        from transformers import AutoModelForCausalLM

        grouped_attention.install()
        if shared_model is not None:
            self.model, self.shares_weights = shared_model.eval(), True
        elif not Path(path).is_dir():
            raise FileNotFoundError(f"no Hugging Face model directory at {path} (models load by local path)")
        else:
            self.model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device).eval()
        self.device, self.keep_prompts = device, keep_prompts
        self.speculation = TRANSFORMERS_SPECULATION if speculation is None else speculation
        self.decode_graphs = for_device(device, cuda_graphs)  # shared by the batches this engine opens
        self.max_context = getattr(self.model.config, "max_position_embeddings", None)
        super().__init__(policy_version=policy_version, max_batch_rows=max_batch_rows)

    def _prefill(self, idx, positions, key_mask):
        attention = None if key_mask is None else key_mask.long()  # None: every row is real, the model's own mask
        out = self.model(input_ids=idx, position_ids=positions, attention_mask=attention, use_cache=True,
                         logits_to_keep=1)
        return out.logits[:, -1], [(layer.keys, layer.values) for layer in out.cache.layers]

    def _prefill_after(self, past, idx, positions, key_mask):
        """A prefill continuing a kept prompt's keys and values (`past`, per layer, each (1, kv heads, P, dim)),
        shared by every row: the rows' own tokens attend it and themselves. Returns the cache's layers, the kept
        columns first."""
        from transformers import DynamicCache

        rows, kept = idx.shape[0], past[0][0].shape[2]
        cache = DynamicCache(ddp_cache_data=[(keys.expand(rows, -1, -1, -1), values.expand(rows, -1, -1, -1))
                                             for keys, values in past], config=self.model.config)
        attention = None if key_mask is None else torch.cat([key_mask.new_ones(rows, kept), key_mask], dim=1).long()
        with grouped_attention.grouped():
            out = self.model(input_ids=idx, position_ids=positions, attention_mask=attention, cache=cache,
                             use_cache=True, logits_to_keep=1)
        return out.logits[:, -1], [(layer.keys, layer.values) for layer in out.cache.layers]

    def _decode(self, idx, positions, cache, mask):
        out = self.model(input_ids=idx, position_ids=positions, attention_mask=mask, cache=cache, use_cache=True,
                         logits_to_keep=1)
        return out.logits[:, -1]

    def _verify(self, idx, positions, cache, mask):
        """Several tokens per row (a sampled token and its drafts), `mask` (rows, 1, T, W): every position's logits."""
        with grouped_attention.grouped():  # the cache's grouped heads attended in place (grouped_attention.py)
            out = self.model(input_ids=idx, position_ids=positions, attention_mask=mask, cache=cache, use_cache=True,
                             logits_to_keep=idx.shape[1])
        return out.logits

    def _score(self, idx):
        return self.model(input_ids=idx, use_cache=False).logits

    def _open_batch(self) -> ContinuousBatch:
        return ContinuousBatch(self._prefill, self._decode, context=self.max_context or 1 << 31, device=self.device,
                               score=self._score,
                               prefill_after=self._prefill_after if self.keep_prompts else None,
                               decode_graphs=self.decode_graphs, verify=self._verify,
                               speculation=self.speculation, stats=self.speculation_stats)

    def _sampling_request(self, request: GenerationRequest) -> SamplingRequest:
        return sampling_request(request)

    def _load(self, state: dict | None) -> None:
        if state is None:  # the trainer's own model, updated in place; it left it in training mode
            self.model.eval()
            return
        missing, unexpected = self.model.load_state_dict(state, strict=False)
        # Tied output embeddings may be absent from a state dict; anything else missing is a wrong model.
        missing = [name for name in missing if not name.endswith("lm_head.weight")]
        if missing or unexpected:
            raise ValueError(f"weights do not fit the engine's model: missing {missing[:5]}, "
                             f"unexpected {unexpected[:5]}")

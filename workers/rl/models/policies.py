"""The trainer's view of a model: next-token logprobs over padded batches, weights for the inference engine,
and saving / loading its trainable state as safetensors.

- `TinyLMPolicy`: the project's character-level model (tiny_lm.py).
- `HFPolicy`: any Hugging Face causal LM from a local path, optionally with LoRA adapters through peft; the
  engine then receives the merged weights under the base model's own parameter names.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import torch
from safetensors.torch import load_file, load_model, save_file, save_model

from .tiny_lm import ModelConfig, TinyLM


def autocast_dtype(precision: str, device: str) -> torch.dtype | None:
    """The dtype the trainer's passes autocast to (None: fp32 throughout) for a run's precision setting on `device`."""
    kind = torch.device(device).type
    has_bf16 = kind != "cuda" or torch.cuda.is_bf16_supported()
    if precision == "fp32" or (precision == "auto" and (kind != "cuda" or not has_bf16)):
        return None
    if not has_bf16:
        raise ValueError(f"precision bf16 asked for, but {device} has no bf16 arithmetic: use fp32 (or auto)")
    return torch.bfloat16


# Positions × vocabulary entries token_logprobs computes at once: 64 MiB of fp32 per chunk on a CPU, whatever the
# batch; 256 MiB on a GPU, where each chunk's dozen kernel launches cost more than the memory.
LOGPROB_CHUNK_ELEMENTS = 1 << 24
LOGPROB_CHUNK_ELEMENTS_GPU = 1 << 26


class _ChosenLogprobs(torch.autograd.Function):
    """The log-softmax of the chosen tokens only, chunk by chunk of positions: a chunk's fp32 log-softmax exists
    while the chunk is computed, so a batch's full-vocabulary fp32 log-softmax (and the copies autograd would keep
    of it) never does. The backward recomputes each chunk's softmax from the saved logits (in the model's dtype:
    bf16 under autocast). Hand-written because the field's fused version (liger-kernel's fused linear
    cross-entropy) returns a loss, not per-token logprobs with their entropy, and needs Triton."""

    @staticmethod
    def forward(ctx, logits, targets, temperature: float, rows_per_chunk: int, with_entropy: bool = True):
        vocabulary = logits.shape[-1]
        flat, chosen_ids = logits.reshape(-1, vocabulary), targets.reshape(-1, 1)
        positions = flat.shape[0]
        chosen = torch.empty(positions, dtype=torch.float32, device=logits.device)
        entropy = torch.empty_like(chosen) if with_entropy else torch.zeros_like(chosen)
        for start in range(0, positions, rows_per_chunk):
            end = min(start + rows_per_chunk, positions)
            logp = torch.log_softmax(_scaled(flat[start:end], temperature), dim=-1)  # (rows, V) fp32, this chunk
            chosen[start:end] = logp.gather(1, chosen_ids[start:end]).squeeze(1)
            if with_entropy:  # SFT and DPO read none: an exp and a product over the vocabulary saved
                entropy[start:end] = -(logp.exp() * logp).sum(-1)
        ctx.save_for_backward(logits, targets)
        ctx.temperature, ctx.rows_per_chunk = temperature, rows_per_chunk
        chosen, entropy = chosen.view(targets.shape), entropy.view(targets.shape)
        ctx.mark_non_differentiable(entropy)
        return chosen, entropy

    @staticmethod
    def backward(ctx, grad_chosen, _grad_entropy):
        logits, targets = ctx.saved_tensors
        vocabulary = logits.shape[-1]
        flat, chosen_ids = logits.reshape(-1, vocabulary), targets.reshape(-1, 1)
        upstream = grad_chosen.reshape(-1, 1).float()
        grad = torch.empty_like(flat)
        for start in range(0, flat.shape[0], ctx.rows_per_chunk):
            end = min(start + ctx.rows_per_chunk, flat.shape[0])
            # d(log_softmax(x)_t) / dx = onehot(t) - softmax(x), times the upstream gradient, over temperature
            part = torch.softmax(_scaled(flat[start:end], ctx.temperature), dim=-1)
            part.mul_(-upstream[start:end]).scatter_add_(1, chosen_ids[start:end], upstream[start:end])
            grad[start:end] = part if ctx.temperature == 1.0 else part.div_(ctx.temperature)
        return grad.view_as(logits), None, None, None, None


def _scaled(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """fp32 logits over the temperature (no copy of fp32 logits at temperature 1)."""
    logits = logits.float()
    return logits if temperature == 1.0 else logits / temperature


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor, temperature: float, *,
                   chunk_elements: int | None = None, with_entropy: bool = True):
    """(B, T, V) logits and (B, T) targets -> fp32 logprobs of the targets (differentiable) and the entropy at
    each position (not), computed `chunk_elements` logits at a time (_ChosenLogprobs)."""
    if chunk_elements is None:
        chunk_elements = LOGPROB_CHUNK_ELEMENTS_GPU if logits.is_cuda else LOGPROB_CHUNK_ELEMENTS
    rows_per_chunk = max(1, chunk_elements // max(logits.shape[-1], 1))
    return _ChosenLogprobs.apply(logits, targets, float(temperature), rows_per_chunk, with_entropy)


class TinyLMPolicy:
    kind = "tinylm"

    def __init__(self, model: TinyLM, *, device: str = "cpu"):
        self.model = model.to(device)
        self.device = device

    @classmethod
    def load(cls, directory: Path, *, device: str = "cpu") -> TinyLMPolicy:
        config = ModelConfig(**json.loads((Path(directory) / "config.json").read_text()))
        model = TinyLM(config)
        model.load_state_dict(load_file(str(Path(directory) / "model.safetensors")))
        return cls(model, device=device)

    def save_pretrained(self, directory: Path) -> None:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "config.json").write_text(json.dumps(self.model.config.__dict__))
        save_file({k: v.contiguous() for k, v in self.model.state_dict().items()}, str(directory / "model.safetensors"))

    @property
    def max_context(self) -> int:
        return self.model.config.block_size

    def trainable_parameters(self):
        return [p for p in self.model.parameters() if p.requires_grad]

    def train(self) -> None:
        self.model.train()

    def logprobs(self, ids: torch.Tensor, attention_mask: torch.Tensor, temperature: float, first: int = 0,
                 with_entropy: bool = True):
        """ids (B, T) right-padded -> logprobs and entropy of ids[:, first + 1:] (B, T-1-first): the trainer asks
        only from the first position any row trains on (the prompts before it need no vocabulary softmax).
        `with_entropy` False: the entropy is zeros, not computed."""
        logits, _ = self.model(ids[:, :-1])
        return token_logprobs(logits[:, first:], ids[:, first + 1:], temperature, with_entropy=with_entropy)

    def frozen_copy(self):
        reference = copy.deepcopy(self.model).eval()
        for parameter in reference.parameters():
            parameter.requires_grad_(False)
        return _FrozenTiny(reference)

    def inference_state(self) -> dict:
        return {k: v.detach().clone() for k, v in self.model.state_dict().items()}

    def save(self, path: Path) -> None:
        save_file({k: v.detach().contiguous().cpu() for k, v in self.model.state_dict().items()}, str(path))

    def restore(self, path: Path) -> None:
        self.model.load_state_dict(load_file(str(path), device=str(self.device)))


class _FrozenTiny:
    def __init__(self, model):
        self.model = model

    @torch.no_grad()
    def logprobs(self, ids, attention_mask, temperature, first: int = 0):
        logits, _ = self.model(ids[:, :-1])
        return token_logprobs(logits[:, first:], ids[:, first + 1:], temperature)[0]


class HFPolicy:
    kind = "hf"

    def __init__(self, path: str, *, device: str = "cpu", lora_rank: int = 0, lora_alpha: int = 16,
                 lora_target_modules: list[str] | None = None, seed: int = 0):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.path, self.device = str(path), device
        # logprobs() computes a prompt the rows of a batch share once (_hf_logits) on a CPU, where compute is the
        # cost; a GPU is bound by kernel launches at these sizes, and sharing takes two forward passes, not one.
        self.shares_prompts = torch.device(device).type == "cpu"
        if not Path(self.path).is_dir():
            raise FileNotFoundError(f"no Hugging Face model directory at {self.path} (models load by local path)")
        self.tokenizer = AutoTokenizer.from_pretrained(self.path)
        self.model = AutoModelForCausalLM.from_pretrained(self.path, dtype=torch.float32).to(device)
        self.lora = lora_rank > 0
        if self.lora:
            from peft import LoraConfig, get_peft_model

            # The adapters' random start is the run's seed's, whichever process builds them: a run's first attempt
            # and the same run trained again start alike (the global RNG is left as it was).
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(seed)
                self.model = get_peft_model(self.model, LoraConfig(
                    r=lora_rank, lora_alpha=lora_alpha, lora_dropout=0.0, task_type="CAUSAL_LM",
                    target_modules=lora_target_modules or "all-linear"))

    @property
    def max_context(self) -> int | None:
        return getattr(self.model.config, "max_position_embeddings", None)

    def trainable_parameters(self):
        return [p for p in self.model.parameters() if p.requires_grad]

    def train(self) -> None:
        self.model.train()

    def logprobs(self, ids: torch.Tensor, attention_mask: torch.Tensor, temperature: float, first: int = 0,
                 with_entropy: bool = True):
        return token_logprobs(_hf_logits(self.model, ids, attention_mask, first, share=self.shares_prompts),
                              ids[:, first + 1:], temperature, with_entropy=with_entropy)

    @property
    def packs_sequences(self) -> bool:
        """Whether SFT and DPO pass a micro-batch's rows end to end in one row (`packed_logprobs`), no pad token
        computed: where the attention runs packed rows as separate sequences (flash attention's variable-length
        kernels). sdpa and eager attend over a pack as one masked square, slower than padded rows."""
        return str(getattr(self.model.config, "_attn_implementation", "")).startswith("flash_attention")

    def packed_logprobs(self, ids: torch.Tensor, position_ids: torch.Tensor, temperature: float = 1.0):
        """ids (1, N): rows concatenated, position_ids (1, N): each row's positions from 0 -> logprobs and
        entropy of ids[:, 1:] (1, N-1). transformers reads the restarting positions as packed sequences and keeps
        each row's attention within itself (masking_utils; only without a cache and an attention mask, hence
        use_cache=False); a row's first token is predicted from the row before it, which the caller masks."""
        logits = self.model(input_ids=ids[:, :-1], position_ids=position_ids[:, :-1], use_cache=False).logits
        return token_logprobs(logits, ids[:, 1:], temperature, with_entropy=False)

    def frozen_copy(self):
        if self.lora:
            return _LoraReference(self.model, share=self.shares_prompts)
        reference = copy.deepcopy(self.model).eval()
        for parameter in reference.parameters():
            parameter.requires_grad_(False)
        return _FrozenHF(reference, share=self.shares_prompts)

    def inference_state(self) -> dict:
        """Full weights under the base model's names, LoRA adapters merged in, each a tensor of its own.

        A plain LoRA layer's weight is its base weight plus PEFT's own delta (get_delta_weight, what merge_adapter
        adds), summed in the delta's tensor: the trainer's weights are only read. Merging into them and out again
        (merge_adapter, then unmerge_adapter) wrote every adapted weight twice, made two deltas and a copy of it
        per step — on a CPU each weight-sized allocation is fresh pages (models/allocator.py): SmolLM2's LoRA
        weight sync took 0.5-1.2 s a step on 2 cores, 0.2-0.3 s this way — and left the base weights (W + d) - d,
        which rounding makes not W (in the tiny test model, 66k of its 104k weights changed by one merge and
        unmerge).
        Other adapter kinds (DoRA, several adapters, a LoRA bias) are merged by PEFT as before."""
        with torch.no_grad():
            merged = self._lora_merged_weights() if self.lora else {}
            if merged is not None:
                return self._base_named_state(merged)
            self.model.merge_adapter()
            try:
                return self._base_named_state({})
            finally:
                self.model.unmerge_adapter()

    def _base_named_state(self, merged: dict) -> dict:
        """The model's state under the base model's names, without the adapters' own tensors: `merged`'s tensor
        where it has one for a key, else a copy."""
        state = {}
        for key, value in self.model.state_dict().items():
            if "lora_" in key:
                continue
            name = key.removeprefix("base_model.model.").replace(".base_layer", "")
            state[name] = merged[key] if key in merged else value.detach().clone()
        return state

    def _lora_merged_weights(self) -> dict | None:
        """{state-dict key of an adapted base weight: base + delta}, or None where some layer is not plain LoRA on a
        Linear with one active adapter."""
        from peft.tuners.lora import LoraLayer
        from peft.tuners.lora.layer import Linear as LoraLinear

        merged = {}
        for module_name, module in self.model.named_modules():
            if not isinstance(module, LoraLayer):
                continue
            adapters = [name for name in module.active_adapters if name in module.lora_A]
            if (not isinstance(module, LoraLinear) or module.merged or len(adapters) != 1
                    or adapters[0] in getattr(module, "lora_variant", {}) or module.lora_bias.get(adapters[0])):
                return None
            # delta + W: the sum merge_adapter's `W += delta` makes, bit for bit (addition commutes)
            merged[f"{module_name}.base_layer.weight"] = module.get_delta_weight(adapters[0]).add_(
                module.get_base_layer().weight)
        return merged

    def save(self, path: Path) -> None:
        if self.lora:
            from peft import get_peft_model_state_dict

            save_file({k: v.detach().contiguous().cpu() for k, v in get_peft_model_state_dict(self.model).items()},
                      str(path))
        else:
            save_model(self.model, str(path))  # handles tied embeddings, which save_file refuses

    def export(self, directory: Path) -> None:
        """A Hugging Face directory of the current weights (LoRA adapters merged in): safetensors, config,
        generation config and tokenizer, loadable with AutoModelForCausalLM.from_pretrained(directory)."""
        model = self.model
        if self.lora:
            model = copy.deepcopy(self.model).merge_and_unload()
        model.save_pretrained(str(directory), safe_serialization=True)
        self.tokenizer.save_pretrained(str(directory))

    def restore(self, path: Path) -> None:
        if self.lora:
            from peft import set_peft_model_state_dict

            set_peft_model_state_dict(self.model, load_file(str(path), device=str(self.device)))
        else:
            load_model(self.model, str(path), device=str(self.device))


# Rows whose prompts differ but open alike — an SFT batch of one template's conversations: the same system message
# and tools' instructions, 400 of a repair row's 1,100 tokens — have that opening computed once when it is at least
# this long (shorter, the extra pass costs more than it saves).
COMMON_OPENING = 32


def _hf_logits(model, ids, attention_mask, first: int, *, share: bool = True):
    """Logits predicting ids[:, first + 1:] only (`logits_to_keep`): with a 49k vocabulary the output layer and
    its softmax over every prompt position cost a fifth of the compute and most of the memory, for nothing.

    Rows that start with the same ids[:, :first + 1] — the samples of one GRPO group share their prompt — have
    that prefix computed once, not once per sample: its keys and values (with their autograd history, so LoRA
    on the attention still learns from them) are handed to every row that shares it, and only the rows' own
    tokens are computed. On a CPU, where a group's 8 copies of a 150-token prompt outweigh 10-token answers,
    that is most of a step's compute; a micro-batch of many groups computes each of its prompts once. Rows whose
    prompts all differ share their common opening instead, when it is COMMON_OPENING tokens or more. `share`
    False: one plain forward pass."""
    rows, prefix, prefixes = ids.shape[0], first + 1, None
    if share and rows > 1 and prefix >= 2:
        prefixes, owners = torch.unique(ids[:, :prefix], dim=0, return_inverse=True)
        if len(prefixes) == rows:
            differs = (ids[:, :prefix] != ids[:1, :prefix]).any(dim=0).nonzero()
            opening = int(differs[0]) if len(differs) else prefix
            if opening >= COMMON_OPENING and bool(attention_mask[:, :opening].all()):
                prefix, prefixes, owners = opening, ids[:1, :opening], torch.zeros(rows, dtype=torch.long,
                                                                                    device=ids.device)
    if prefixes is None or len(prefixes) == rows:
        return model(input_ids=ids[:, :-1], attention_mask=attention_mask[:, :-1],
                     logits_to_keep=ids.shape[1] - 1 - first).logits
    shared = model(input_ids=prefixes, use_cache=True, logits_to_keep=1)
    cache = shared.cache
    for layer in cache.layers:  # each row gets its prefix's keys and values; the gradients flow back to it
        if len(prefixes) == 1:  # a view per row, no copy
            layer.keys = layer.keys.expand(rows, -1, -1, -1)
            layer.values = layer.values.expand(rows, -1, -1, -1)
        else:
            layer.keys = layer.keys.index_select(0, owners)
            layer.values = layer.values.index_select(0, owners)
    suffix = ids[:, prefix:-1]
    positions = torch.arange(prefix, prefix + suffix.shape[1], device=ids.device).expand(rows, -1)
    if prefix <= first:  # a common opening: the rows' own prompts follow it, logits from `first` on
        return model(input_ids=suffix, cache=cache, position_ids=positions, attention_mask=attention_mask[:, :-1],
                     use_cache=True, logits_to_keep=ids.shape[1] - 1 - first).logits
    # The prefix's last position predicts each row's first trained token.
    first_logits = shared.logits.index_select(0, owners)
    if not suffix.shape[1]:
        return first_logits
    rest = model(input_ids=suffix, cache=cache, position_ids=positions, attention_mask=attention_mask[:, :-1],
                 use_cache=True).logits
    return torch.cat([first_logits, rest], dim=1)


class _FrozenHF:
    def __init__(self, model, *, share: bool):
        self.model, self.share = model, share

    @torch.no_grad()
    def logprobs(self, ids, attention_mask, temperature, first: int = 0):
        logits = _hf_logits(self.model, ids, attention_mask, first, share=self.share)
        return token_logprobs(logits, ids[:, first + 1:], temperature)[0]


class _LoraReference:
    """The base model is the reference: the same module with its adapters switched off."""

    def __init__(self, model, *, share: bool):
        self.model, self.share = model, share

    @torch.no_grad()
    def logprobs(self, ids, attention_mask, temperature, first: int = 0):
        with self.model.disable_adapter():
            logits = _hf_logits(self.model, ids, attention_mask, first, share=self.share)
        return token_logprobs(logits, ids[:, first + 1:], temperature)[0]

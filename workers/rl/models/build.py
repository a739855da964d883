"""The model a run trains and samples with (policy, engine, chat format), built from the run's config.

`builtin:demo-tiny` is the project's own base model: pretrained here from the run's tasks (their instances
rendered with their references, half of them wrong) — or, for an SFT or DPO run on a dataset alone, from the
dataset's own conversations — on first use and cached in `models_dir` by the hash of its corpus, so every later
run on the same tasks starts from the same weights. `builtin:smollm2-135m-instruct` and
the other packaged models (packaged.py) are real LLMs shipped in a Python package, converted on first use and
cached in `models_dir` by the file's hash. Anything else is the local path of a Hugging Face causal LM.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import random
from pathlib import Path

import torch

from workers.egress import PUBLIC_ONLY, EgressPolicy
from workers.storage import Storage

from ..config import GRPOConfig, PolicyConfig
from ..protocols import Model
from ..tasks.taskset import TaskSet
from .allocator import return_freed_tensors_to_the_os
from .base_model import pretrain, reference_turns
from .chat_formats import CharChat, CharTokenizer, HFChat
from .packaged import DEMO_MODEL, PACKAGED_MODELS, TRAINABLE_BUILTINS, converted
from .policies import HFPolicy, TinyLMPolicy, autocast_dtype
from .weights import check_weights

PRETRAIN_SEED = 0


def resolve_device(name: str) -> str:
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device {name!r} asked for, but torch sees no CUDA device on this worker")
    return name


Corpus = list[tuple[str, list[dict]]]  # (prompt, the assistant's side of the conversation): what pretrain() takes


def demo_corpus(tasks: TaskSet) -> Corpus:
    """The demo model's corpus for a run on `tasks`: every instance with a reference answer."""
    rng = random.Random(PRETRAIN_SEED)
    corpus = []
    for key, template in sorted(tasks.templates.items()):
        for item in tasks.items[key].values():
            turns = reference_turns(tools=template.tools, inputs=item.inputs, hidden=item.hidden, rng=rng)
            if turns is not None:
                corpus.append((template.prompt_template.format(**item.inputs), turns))
    return corpus


def demo_base_model(corpus: Corpus, *, models_dir: Path, pretrain_seconds: float, progress=None,
                    shared: Storage | None = None) -> Path:
    """The directory of the demo base model pretrained on `corpus`, pretraining it if it is not cached. With
    `shared` (the blob storage's models on an object store), a model another host pretrained is fetched from
    there, and one pretrained here is published there."""
    digest = hashlib.sha256(json.dumps([corpus, pretrain_seconds, PRETRAIN_SEED, CharTokenizer().signature],
                                       sort_keys=True).encode()).hexdigest()[:16]
    directory = Path(models_dir) / f"demo-tiny-{digest}"
    directory.parent.mkdir(parents=True, exist_ok=True)
    with open(directory.parent / f".{directory.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two workers starting at once pretrain once
        if (directory / "model.safetensors").is_file():
            return directory
        if shared is not None and shared.published(directory.name):
            return shared.fetch(directory.name, into=directory)
        model, report = pretrain(corpus, seconds=pretrain_seconds, seed=PRETRAIN_SEED, progress=progress)
        partial = directory.with_name(directory.name + ".partial")
        policy = TinyLMPolicy(model)
        policy.save_pretrained(partial)
        (partial / "pretraining.json").write_text(json.dumps(report))
        partial.rename(directory)
        if shared is not None:
            shared.publish(directory.name, directory)
    return directory


def server_engine(config: GRPOConfig, *, weights: Storage, token: str, max_context: int | None,
                  egress: EgressPolicy = PUBLIC_ONLY):
    """The engine of a run that generates on inference servers (config.inference_servers): the trainer's weights
    go to `weights` after each step, and every server loads them from there; `egress` lists the servers the
    operator allows (EgressRefused otherwise)."""
    from ..engines.server import ServerEngine

    if config.context_length:
        max_context = min(max_context or config.context_length, config.context_length)
    return ServerEngine(config.server_urls(), weights=weights, token=token, max_staleness=config.max_staleness,
                        max_context=max_context, max_concurrency=max(8, config.rollout_concurrency * 4),
                        egress=egress)


def _speculation(config):
    """The engine's speculative decoding as the config says (RolloutConfig.speculative_tokens; a config without the
    field, the engine's default)."""
    from ..engines.speculation import OFF, Speculation

    tokens = getattr(config, "speculative_tokens", None)
    if tokens is None:
        return None
    return Speculation(tokens=tokens) if tokens else OFF


def build_model(config: PolicyConfig, corpus: Corpus | None, *, models_dir: Path, pretrain_seconds: float,
                progress=None, shared: Storage | None = None, weights: Storage | None = None,
                server_token: str = "", egress: EgressPolicy = PUBLIC_ONLY, sampling: bool = True) -> Model:
    """The run's model on the device the config asks for. The built-in demo model is pretrained on `corpus` (a
    bundle's tasks' `demo_corpus`, or an SFT or DPO run's dataset's: training/data_files.py); no other model reads
    it. `models_dir` caches built-in base models (and `shared`,
    if given, shares them between hosts); `progress(step, loss, seconds)` follows a pretraining. With
    `weights` (where a GRPO run with inference_servers publishes its weights), the engine is the servers'
    (engines/server.py, `server_token` the bearer token of their weight endpoint); without (an evaluation of a
    checkpoint), the in-process engine samples, as the config (a RolloutConfig) says. `sampling` False (SFT and
    DPO): no engine."""
    return_freed_tensors_to_the_os()  # a run's tensors of changing sizes would fragment malloc's heaps otherwise
    device = resolve_device(config.device)
    on_servers = weights is not None
    path = config.model
    if config.model in PACKAGED_MODELS:
        check_weights(config.model, config.model_sha256)  # the installed file, before converting it
        path = str(converted(PACKAGED_MODELS[config.model], models_dir, shared=shared))
    elif config.model.startswith("builtin:"):
        if config.model != DEMO_MODEL:
            raise ValueError(f"unknown built-in model {config.model!r}; the built-in ones are "
                             f"{', '.join(TRAINABLE_BUILTINS)}")
        from ..engines.torch_engine import TorchEngine

        if not corpus:
            raise ValueError(f"{DEMO_MODEL} is pretrained on the run's tasks or dataset, and this one has neither")
        policy = TinyLMPolicy.load(demo_base_model(corpus, models_dir=models_dir, pretrain_seconds=pretrain_seconds,
                                                   progress=progress, shared=shared), device=device)
        if not sampling:
            return Model(policy=policy, engine=None, chat=CharChat())
        if on_servers:
            return Model(policy=policy, engine=server_engine(config, weights=weights, token=server_token,
                                                             max_context=policy.model.config.block_size,
                                                             egress=egress),
                         chat=CharChat())
        return Model(policy=policy, engine=TorchEngine(policy.model, device=device, share=config.mode == "sync",
                                                       speculation=_speculation(config)),
                     chat=CharChat())
    else:
        check_weights(path, config.model_sha256)
    policy = HFPolicy(path, device=device, lora_rank=config.lora_rank, lora_alpha=config.lora_alpha,
                      seed=config.seed)
    if config.chat_template:
        policy.tokenizer.chat_template = config.chat_template
    chat = HFChat(policy.tokenizer)
    if not sampling:
        return Model(policy=policy, engine=None, chat=chat)
    if on_servers:
        context = getattr(policy.model.config, "max_position_embeddings", None)
        return Model(policy=policy, engine=server_engine(config, weights=weights, token=server_token,
                                                         max_context=context, egress=egress), chat=chat)
    if config.engine == "vllm":
        from ..engines.vllm_engine import VLLMEngine

        engine = VLLMEngine(path, seed=config.seed)
    else:
        from ..engines.hf import TransformersEngine

        # A sync run samples from the trainer's model itself: no copy of the weights per step. Not with LoRA:
        # adapters applied unmerged made SmolLM2's decoding 1.35x slower on 2 CPU cores (32 rows x 32 tokens:
        # 7.4 s against 5.5 s merged), far more than the merge and copy a step costs (about 0.3 s).
        share = config.mode == "sync" and not config.lora_rank
        # A copy of its own samples in the trainer's precision (bf16: half the weights to read per token).
        dtype = autocast_dtype(config.precision, device) or torch.float32
        engine = TransformersEngine(path, device=device, dtype=dtype, shared_model=policy.model if share else None,
                                    speculation=_speculation(config))
    if config.context_length:
        engine.max_context = min(engine.max_context or config.context_length, config.context_length)
    return Model(policy=policy, engine=engine, chat=chat)

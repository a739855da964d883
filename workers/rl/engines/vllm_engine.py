"""The `vllm` engine, for GPU workers: vLLM in the trainer's process, new weights loaded in place.

vLLM pins its own torch and transformers, so it lives in the GPU worker's environment (requirements/gpu.txt,
Dockerfile.gpu) and is imported only when this engine is built. It runs in-process with the
`external_launcher` executor (as TRL's colocate mode does), which keeps the model object reachable: weight
sync is `model.load_weights(...)` on the live model plus a prefix-cache reset — no restart, no disk.

Logprobs are vLLM's "processed" ones (after temperature), i.e. of the distribution really sampled from,
matching what the trainer recomputes.
"""

from __future__ import annotations

import os
import socket

from . import BatchingEngine, Completion, GenerationRequest, trim


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _likeliest(entry: dict, k: int) -> list[tuple[int, float]]:
    """The k likeliest of a vLLM logprobs entry (the sampled token and the top k, each with its rank)."""
    ranked = sorted(entry.items(), key=lambda item: item[1].rank)
    return [(token, logprob.logprob) for token, logprob in ranked if logprob.rank <= k]


class VLLMEngine(BatchingEngine):
    name = "vllm"

    def __init__(self, path: str, *, seed: int = 0, policy_version: int = 0, gpu_memory_utilization: float = 0.3,
                 max_model_len: int | None = None, dtype: str = "auto", max_batch_rows: int = 4096):
        try:
            from vllm import LLM
        except ImportError as exc:
            raise RuntimeError("the vllm engine needs vLLM, which GPU workers install from requirements/gpu.txt "
                               f"(it is not part of the CPU environment): {exc}") from None
        # external_launcher reads the torch.distributed rendezvous from the environment; one process, one rank.
        for name, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1")):
            os.environ.setdefault(name, value)
        os.environ.setdefault("MASTER_PORT", str(_free_port()))
        self.llm = LLM(model=str(path), seed=seed, dtype=dtype, gpu_memory_utilization=gpu_memory_utilization,
                       max_model_len=max_model_len, distributed_executor_backend="external_launcher",
                       logprobs_mode="processed_logprobs", enable_prefix_caching=True)
        self.max_context = self.llm.llm_engine.model_config.max_model_len
        super().__init__(policy_version=policy_version, max_batch_rows=max_batch_rows)

    def _sample(self, requests: list[GenerationRequest]) -> list[list[Completion]]:
        from vllm import SamplingParams

        prompts = [{"prompt_token_ids": list(r.prompt_ids)} for r in requests]
        # vLLM generates at least one token: a request for none (a scoring of the prompt) gets its one dropped.
        params = [SamplingParams(n=r.n, temperature=r.temperature, max_tokens=max(1, r.max_new_tokens),
                                 stop_token_ids=list(r.stop_ids), logprobs=r.top_logprobs, seed=r.seed, top_p=1.0,
                                 top_k=-1, skip_special_tokens=False, prompt_logprobs=r.prompt_logprobs,
                                 presence_penalty=r.presence_penalty, frequency_penalty=r.frequency_penalty)
                  for r in requests]
        outputs = self.llm.generate(prompts, sampling_params=params, use_tqdm=False)  # vLLM batches them all
        results = []
        for request, output in zip(requests, outputs, strict=True):
            scored = None
            if request.prompt_logprobs is not None:
                scored = [None] + [(entry[token].logprob, entry[token].rank, _likeliest(entry, request.prompt_logprobs))
                                   for token, entry in zip(request.prompt_ids[1:], output.prompt_logprobs[1:],
                                                           strict=True)]
            group = []
            for sample in output.outputs:
                ids = list(sample.token_ids)
                entries = sample.logprobs or []
                logprobs = [entry[token].logprob for token, entry in zip(ids, entries, strict=True)]
                top = [_likeliest(entry, request.top_logprobs) for entry in entries] if request.top_logprobs else None
                completion = trim(ids, logprobs, request.stop_ids, request.max_new_tokens, top)
                completion.prompt_logprobs = scored
                group.append(completion)
            results.append(group)
        return results

    def _load(self, state: dict) -> None:
        model = self.llm.llm_engine.model_executor.driver_worker.model_runner.model
        model.load_weights(list(state.items()))
        self.llm.reset_prefix_cache()  # cached prefixes were computed with the old weights

    def _release(self) -> None:
        del self.llm

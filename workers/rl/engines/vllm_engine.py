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
        params = [SamplingParams(n=r.n, temperature=r.temperature, max_tokens=r.max_new_tokens,
                                 stop_token_ids=list(r.stop_ids), logprobs=0, seed=r.seed, top_p=1.0, top_k=-1,
                                 skip_special_tokens=False) for r in requests]
        outputs = self.llm.generate(prompts, sampling_params=params, use_tqdm=False)  # vLLM batches them all
        results = []
        for request, output in zip(requests, outputs, strict=True):
            group = []
            for sample in output.outputs:
                ids = list(sample.token_ids)
                logprobs = [entry[token].logprob for token, entry in zip(ids, sample.logprobs or [], strict=True)]
                group.append(trim(ids, logprobs, request.stop_ids, request.max_new_tokens))
            results.append(group)
        return results

    def _load(self, state: dict) -> None:
        model = self.llm.llm_engine.model_executor.driver_worker.model_runner.model
        model.load_weights(list(state.items()))
        self.llm.reset_prefix_cache()  # cached prefixes were computed with the old weights

    def _release(self) -> None:
        del self.llm

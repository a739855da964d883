"""`manage.py bench engine`: tokens per second of our transformers engine against Hugging Face `generate` on
the same model, prompts and sampling settings, at several numbers of concurrent requests.

The model is SmolLM2-135M-Instruct (builtin:smollm2-135m-instruct, converted on first use). The prompts are the
real-model demo's kinds (a sum, a function to write, an expression for the tool), rendered with the model's
chat template. Ours: every request submitted at once from its own thread, as rollouts do; the engine batches
them continuously. `generate`: one left-padded batch of the same prompts, sampling at the same temperature.
Both are told to stop at the end-of-turn token and to write at most `new_tokens`; tokens are counted up to and
including the stop, so a batch that runs on for its longest row is not credited for the padding it writes.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import torch

PROMPTS = [
    "What is {a}+{b}? Answer with just the number.",
    "Write a Python function add_all(xs) that returns the sum of the numbers in xs. Reply with the code in one "
    "```python block.",
    "What is {a} * {b} + 317? Compute it with run_python first, then answer with just the number.",
]


def _prompts(tokenizer, count: int) -> list[list[int]]:
    from ..models.chat_formats import HFChat

    chat = HFChat(tokenizer)
    return [chat.prompt([{"role": "user", "content": PROMPTS[i % len(PROMPTS)].format(a=11 + i, b=29 + 3 * i)}], [])
            for i in range(count)]


def _ours(directory: Path, prompts, *, new_tokens: int, stop_ids, temperature: float) -> dict:
    from ..engines import GenerationRequest
    from ..engines.hf import TransformersEngine

    engine = TransformersEngine(str(directory))
    try:
        results = [None] * len(prompts)

        def ask(index):
            results[index] = engine.generate([GenerationRequest(prompts[index], 1, new_tokens, stop_ids, temperature,
                                                                seed=index)])[0][0]

        # One warm-up request: the first forward pass allocates and picks kernels.
        engine.generate([GenerationRequest(prompts[0], 1, 4, stop_ids, temperature, seed=0)])
        threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(prompts))]
        started = time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        seconds = time.perf_counter() - started
    finally:
        engine.close()
    tokens = sum(len(completion.token_ids) for completion in results)
    return {"seconds": round(seconds, 2), "tokens": tokens, "tokens_per_second": round(tokens / seconds, 1)}


def _generate(model, tokenizer, prompts, *, new_tokens: int, stop_ids, temperature: float) -> dict:
    width = max(len(p) for p in prompts)
    pad = tokenizer.pad_token_id
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    attention = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    torch.manual_seed(0)
    model.generate(ids[:1], attention_mask=attention[:1], max_new_tokens=4, do_sample=True)  # warm-up
    started = time.perf_counter()
    with torch.no_grad():
        out = model.generate(ids, attention_mask=attention, max_new_tokens=new_tokens, do_sample=True,
                             temperature=temperature, top_k=0, top_p=1.0, eos_token_id=list(stop_ids), pad_token_id=pad)
    seconds = time.perf_counter() - started
    tokens = 0
    for row in out[:, width:].tolist():
        ends = [i for i, token in enumerate(row) if token in stop_ids]
        tokens += ends[0] + 1 if ends else len(row)
    return {"seconds": round(seconds, 2), "tokens": tokens, "tokens_per_second": round(tokens / seconds, 1)}


def run(*, models_dir: Path, concurrency: tuple[int, ...] = (8, 32), new_tokens: int = 64,
        temperature: float = 1.0, **_) -> dict:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ..models.chat_formats import HFChat
    from ..models.packaged import SMOLLM2_135M, converted

    directory = converted(SMOLLM2_135M, models_dir)
    tokenizer = AutoTokenizer.from_pretrained(directory)
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    stop_ids = HFChat(tokenizer).stop_ids
    result = {"model": SMOLLM2_135M.name, "new_tokens": new_tokens, "temperature": temperature,
              "torch_threads": torch.get_num_threads(), "by_concurrency": {}}
    for count in concurrency:
        prompts = _prompts(tokenizer, count)
        ours = _ours(directory, prompts, new_tokens=new_tokens, stop_ids=stop_ids, temperature=temperature)
        theirs = _generate(model, tokenizer, prompts, new_tokens=new_tokens, stop_ids=stop_ids,
                           temperature=temperature)
        result["by_concurrency"][str(count)] = {
            "ours": ours, "generate": theirs,
            "speedup": round(ours["tokens_per_second"] / max(theirs["tokens_per_second"], 1e-9), 2)}
    return result

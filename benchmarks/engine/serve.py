"""`manage.py bench serve`: `serve`'s OpenAI-compatible server against a plain transformers `generate` loop, on
SmolLM2-135M-Instruct and the same prompts, at 1, 4 and 16 concurrent clients.

Ours: the app `manage.py serve` runs (workers/rl/serving/app.py) under uvicorn, its transformers engine batching
continuously; each client is a thread with the official `openai` client, sending its requests one after the
other with stream=True; time to first token is the wait for the first streamed chunk. The loop: what a server
without batching does — one request at a time, `model.generate` on it alone; its clients' requests all arrive at
the start and are served in turn, so a request's first token comes when its generation ends (it does not stream).
Both write at most `new_tokens` at temperature 1 and stop at the end-of-turn token; tokens are counted up to the
stop.

The repository workload (`repository`): the prompts and tool results of the demo's recorded repository trajectories
(`repository_conversations`, the expert replays `manage.py bench` builds: apps/demo/repair_replays.py), each sent
whole with the tools offered, all at once from one client thread each, to two servers of the same weights: one
with speculative decoding from the context (`serve --speculative-tokens 4`, engines/speculation.py) and one
without, taking turns for `passes` rounds after an untimed one. Its figures: tokens per second of each, their
ratio, and the drafted tokens the server's engine accepted.
"""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import torch

from .engine import PROMPTS, speculation_taking_turns


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(share * len(ordered)))] * 1000, 1) if ordered else 0.0


def _messages(count: int) -> list[list[dict]]:
    return [[{"role": "user", "content": PROMPTS[i % len(PROMPTS)].format(a=11 + i, b=29 + 3 * i)}]
            for i in range(count)]


def _ours(base_url: str, clients: int, per_client: int, new_tokens: int) -> dict:
    import openai

    conversations = _messages(clients * per_client)
    firsts, tokens, lock = [], [0], threading.Lock()

    def client(index: int) -> None:
        api = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=600)
        for number in range(per_client):
            began = time.perf_counter()
            first = None
            stream = api.chat.completions.create(model="bench", messages=conversations[index * per_client + number],
                                                 max_tokens=new_tokens, temperature=1.0, stream=True,
                                                 stream_options={"include_usage": True}, seed=index * 100 + number)
            for chunk in stream:
                if first is None and chunk.choices and chunk.choices[0].delta.content:
                    first = time.perf_counter() - began
                if chunk.usage is not None:
                    with lock:
                        tokens[0] += chunk.usage.completion_tokens
            with lock:
                firsts.append(first if first is not None else time.perf_counter() - began)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    seconds = time.perf_counter() - started
    return {"requests": len(firsts), "tokens": tokens[0], "seconds": round(seconds, 2),
            "tokens_per_second": round(tokens[0] / seconds, 1), "ttft_p50_ms": _percentile(firsts, 0.5),
            "ttft_p95_ms": _percentile(firsts, 0.95)}


def _start(engine, chat) -> tuple:
    """(the uvicorn server, its base URL) of `serve`'s app on `engine`, started in a thread."""
    import uvicorn

    from workers.rl.serving.app import build_app

    port = _port()
    server = uvicorn.Server(uvicorn.Config(build_app(engine=engine, chat=chat, model_name="bench"),
                                          host="127.0.0.1", port=port, log_level="warning"))
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.05)
    return server, f"http://127.0.0.1:{port}/v1"


def _conversations_at_once(base_url: str, conversations: list, new_tokens: int) -> tuple[int, float]:
    """(completion tokens, seconds) for every conversation sent at once, one client thread each; with tools offered
    the answer comes whole (chat_completions.py), so these are not streamed."""
    import openai

    tokens, lock = [0], threading.Lock()

    def client(index: int) -> None:
        messages, tools = conversations[index]
        api = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=1200)
        answer = api.chat.completions.create(model="bench", messages=messages, max_tokens=new_tokens,
                                             temperature=1.0, seed=index,
                                             tools=[{"type": "function", "function": tool} for tool in tools])
        with lock:
            tokens[0] += answer.usage.completion_tokens

    threads = [threading.Thread(target=client, args=(i,)) for i in range(len(conversations))]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return tokens[0], time.perf_counter() - started


def _repository(directory: Path, chat, conversations: list, new_tokens: int, passes: int = 2) -> dict:
    """The repository workload with and without speculation (the module's docstring)."""
    from workers.rl.engines.hf import TransformersEngine
    from workers.rl.engines.speculation import OFF, Speculation

    engines = {"without": TransformersEngine(str(directory), speculation=OFF)}
    engines["with"] = TransformersEngine(str(directory), shared_model=engines["without"].model,
                                         speculation=Speculation(tokens=4))
    servers = {side: _start(engine, chat) for side, engine in engines.items()}
    try:
        figures = speculation_taking_turns(
            lambda side: _conversations_at_once(servers[side][1], conversations, new_tokens), engines["with"],
            passes=passes)
    finally:
        for server, _ in servers.values():
            server.should_exit = True
        for engine in engines.values():
            engine.close()
    return {"requests": len(conversations),
            "prompt_tokens_mean": round(sum(len(chat.prompt(m, t)) for m, t in conversations) / len(conversations)),
            **figures}


def _loop(model, chat, clients: int, per_client: int, new_tokens: int) -> dict:
    conversations = _messages(clients * per_client)
    firsts, tokens = [], 0
    torch.manual_seed(0)
    started = time.perf_counter()
    for conversation in conversations:  # every request arrived at the start; served one at a time
        ids = torch.tensor([chat.prompt(conversation, [])])
        with torch.no_grad():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens, do_sample=True,
                                 temperature=1.0, top_k=0, top_p=1.0, eos_token_id=list(chat.stop_ids),
                                 pad_token_id=chat.tokenizer.pad_token_id)
        row = out[0, ids.shape[1]:].tolist()
        ends = [i for i, token in enumerate(row) if token in chat.stop_ids]
        tokens += ends[0] + 1 if ends else len(row)
        firsts.append(time.perf_counter() - started)
    seconds = time.perf_counter() - started
    return {"requests": len(firsts), "tokens": tokens, "seconds": round(seconds, 2),
            "tokens_per_second": round(tokens / seconds, 1), "ttft_p50_ms": _percentile(firsts, 0.5),
            "ttft_p95_ms": _percentile(firsts, 0.95)}


def run(*, models_dir: Path, clients: tuple[int, ...] = (1, 4, 16), per_client: int = 2, new_tokens: int = 64,
        repository_conversations: list | None = None, **_) -> dict:
    """`repository_conversations`: [(messages, tools)] of the repository workload (`bench` builds them)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from workers.rl.engines.hf import TransformersEngine
    from workers.rl.models.chat_formats import HFChat
    from workers.rl.models.packaged import SMOLLM2_135M, converted

    directory = converted(SMOLLM2_135M, models_dir)
    tokenizer = AutoTokenizer.from_pretrained(directory)
    chat = HFChat(tokenizer)
    engine = TransformersEngine(str(directory))
    server, base_url = _start(engine, chat)
    result = {"model": SMOLLM2_135M.name, "new_tokens": new_tokens, "requests_per_client": per_client,
              "torch_threads": torch.get_num_threads(), "by_clients": {}}
    try:
        _ours(base_url, 1, 1, 4)  # warm-up: the first forward pass allocates and picks kernels
        ours = {count: _ours(base_url, count, per_client, new_tokens) for count in clients}
    finally:
        server.should_exit = True
        engine.close()
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    _loop(model, chat, 1, 1, 4)  # its warm-up
    for count in clients:
        theirs = _loop(model, chat, count, per_client, new_tokens)
        result["by_clients"][str(count)] = {
            "serve": ours[count], "generate_loop": theirs,
            "throughput_ratio": round(ours[count]["tokens_per_second"] / max(theirs["tokens_per_second"], 1e-9), 2)}
    result["target"] = {"throughput_ratio_at_16": 3}
    top = result["by_clients"].get("16")
    result["meets_target"] = bool(top and top["throughput_ratio"] >= 3)
    if repository_conversations:
        result["repository"] = _repository(directory, chat, repository_conversations, new_tokens)
        result["repository"]["target_speedup"] = 1.5
    return result

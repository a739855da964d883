"""`manage.py bench engine`: tokens per second of our transformers engine against Hugging Face `generate` (and
its continuous batching, `generate_batch`) on the same model, prompts and sampling settings, at several numbers
of concurrent requests, on the CPU or a GPU, in fp32 or bf16 — and what one decode step launches.

The model is SmolLM2-135M-Instruct (builtin:smollm2-135m-instruct, converted on first use), or its architecture
with random seeded weights (`random_weights`: speed only, where the weights cannot be had; a random model rarely
writes the end-of-turn token, so every sample runs to `new_tokens` on every side). The prompts are the
real-model demo's kinds (a sum, a function to write, an expression for the tool), rendered with the model's chat
template. Ours: every request submitted at once from its own thread, as rollouts do; the engine batches them
continuously. `generate`: one left-padded batch of the same prompts, sampling at the same temperature.
`generate_batch`: transformers' continuous batching (paged attention). All are told to stop at the end-of-turn
token and to write at most `new_tokens`; tokens are counted up to and including the stop, so a batch that runs
on for its longest row is not credited for the padding it writes.

`aten_ops_per_decode_step`: the aten operators (torch.profiler) one steady-state decode step of ours runs at
that many rows — the CPU-side cost of a step, and on a GPU close to its kernel launches
(`kernel_launches_per_decode_step`, counted there too); `aten_ops_per_forward`: the same for one plain forward
pass of the model over one token per row, the floor a step cannot go below. A step's count must not grow with
the rows.

On a GPU ours records its decode steps as CUDA graphs (engines/decode_graphs.py): `ours` is that engine,
`ours_without_cuda_graphs` the same engine decoding eagerly (both timed after an untimed pass of the same
workload, which records the graphs of its shapes), `cuda_graphs` what the graphs did (recorded, replayed, or why
recording failed), with the step's counts eager too (`..._without_cuda_graphs`). `cuda_graphs_against_eager`:
the same greedy rows decoded by the replayed graphs and by the same padded steps run eagerly, in lockstep, the
largest difference of their logits while their tokens agree — a replay reading a stale mask or position would
differ by whole logits, not by rounding.

`second_turn`: a tool call's second turn (a group's rows each asking again with its call and the tool's result
appended), timed on an engine that kept the first turn's prompt and on one that did not (engines/prefix_cache.py).

`speculation`: speculative decoding from the context (workers/rl/engines/speculation.py) on two workloads, the
repository tasks' (`repository_conversations`, which `manage.py bench` builds: apps/demo/repair_replays.py, the
repair domain's expert trajectories cut before each turn, the model copying back lines it viewed) and the short
answers above: tokens per second of ours with it and without (`speedup`), and the drafts it verified and accepted.
Each side runs the workload once untimed first (its prompts then kept, as a trajectory's later turns find its
earlier ones: the timed passes measure decoding), then the sides take turns over `passes` timed passes, so that
other work on the machine weighs on both alike.

`measure_engine` imports no Django: deploy/gpu's check calls it on a machine without the studio.
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
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
KERNEL_LAUNCHES = ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernelEx",
                   "cudaGraphLaunch")


def _prompts(tokenizer, count: int) -> list[list[int]]:
    from workers.rl.models.chat_formats import HFChat

    chat = HFChat(tokenizer)
    return [chat.prompt([{"role": "user", "content": PROMPTS[i % len(PROMPTS)].format(a=11 + i, b=29 + 3 * i)}], [])
            for i in range(count)]


def _synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _rate(tokens: int, seconds: float) -> dict:
    return {"seconds": round(seconds, 3), "tokens": tokens, "tokens_per_second": round(tokens / seconds, 1)}


def load_model(model_dir: Path, *, device: str, dtype: str, random_weights: bool):
    """The model on `device` in `dtype`: loaded from `model_dir`, or built from its config with random weights
    (seeded: the same model on every machine)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    if random_weights:
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir), dtype=DTYPES[dtype])
    else:
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=DTYPES[dtype])
    return model.to(device).eval()


def _ours(engine, prompts, *, new_tokens: int, stop_ids, temperature: float, warm_pass: bool = False) -> dict:
    """`warm_pass`: the whole workload once untimed first, so the CUDA graphs of its shapes are recorded before
    the timed pass (a run's later steps find theirs recorded; vLLM records its own at start-up)."""
    from workers.rl.engines import GenerationRequest

    results = [None] * len(prompts)

    def ask(index):
        results[index] = engine.generate([GenerationRequest(prompts[index], 1, new_tokens, stop_ids, temperature,
                                                            seed=index)])[0][0]

    def run_all() -> float:
        threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(prompts))]
        _synchronize(engine.device)
        started = time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        _synchronize(engine.device)
        return time.perf_counter() - started

    if warm_pass:
        run_all()
    else:  # one warm-up request: the first forward pass allocates and picks kernels
        engine.generate([GenerationRequest(prompts[0], 1, 4, stop_ids, temperature, seed=0)])
    graphs = engine.decode_graphs
    recorded = graphs.recorded if graphs is not None else 0
    seconds = run_all()
    rate = _rate(sum(len(completion.token_ids) for completion in results), seconds)
    if graphs is not None:  # recordings in the timed pass are in its seconds: there should be none
        rate["graphs_recorded_while_timed"] = graphs.recorded - recorded
    return rate


def _generate(model, tokenizer, prompts, *, device: str, new_tokens: int, stop_ids, temperature: float) -> dict:
    width = max(len(p) for p in prompts)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else stop_ids[0]
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=device)
    attention = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
    settings = {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0,
                "eos_token_id": list(stop_ids), "pad_token_id": pad}
    torch.manual_seed(0)
    with torch.inference_mode():
        model.generate(ids[:1], attention_mask=attention[:1], max_new_tokens=4, **settings)  # warm-up
        _synchronize(device)
        started = time.perf_counter()
        out = model.generate(ids, attention_mask=attention, max_new_tokens=new_tokens, **settings)
        _synchronize(device)
    seconds = time.perf_counter() - started
    tokens = 0
    for row in out[:, width:].tolist():
        ends = [i for i, token in enumerate(row) if token in stop_ids]
        tokens += ends[0] + 1 if ends else len(row)
    return _rate(tokens, seconds)


def _generate_batch(model, tokenizer, prompts, *, device: str, new_tokens: int, stop_ids,
                    temperature: float) -> dict:
    from transformers import GenerationConfig

    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else stop_ids[0]
    config = GenerationConfig(max_new_tokens=new_tokens, do_sample=True, temperature=temperature, top_k=0, top_p=1.0,
                              eos_token_id=list(stop_ids), pad_token_id=pad)
    previous = model.config._attn_implementation
    model.set_attn_implementation("paged|sdpa")
    try:
        with torch.inference_mode():
            model.generate_batch(inputs=prompts[:2], generation_config=config)  # warm-up
            _synchronize(device)
            started = time.perf_counter()
            out = model.generate_batch(inputs=prompts, generation_config=config)
            _synchronize(device)
        seconds = time.perf_counter() - started
    finally:
        model.set_attn_implementation(previous)
    return _rate(sum(len(result.generated_tokens) for result in out.values()), seconds)


def _profiled(run) -> dict:
    """aten operators (and, on a GPU, kernel launches) of one call of `run`."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with profile(activities=activities) as profiler:
        run()
    names = [event.name for event in profiler.events()]
    counts = {"aten_ops": sum(name.startswith("aten::") for name in names)}
    if torch.cuda.is_available():
        counts["kernel_launches"] = sum(name in KERNEL_LAUNCHES for name in names)
    return counts


def _step_counts(engine, model, prompts, *, stop_ids) -> dict:
    """Operators of one steady-state decode step of ours at len(prompts) rows (no row joins or leaves during it),
    and of one plain forward pass over one token per row."""
    from workers.rl.engines.sampling import SamplingRequest

    batch = engine._open_batch()
    with torch.inference_mode():
        batch.admit([(SamplingRequest(prompt, 1, 1 << 20, (), 1.0, seed=index), index)
                     for index, prompt in enumerate(prompts)])
        for _ in range(3):  # past the first steps' allocations
            batch.advance()
        _synchronize(engine.device)
        graphs = engine.decode_graphs
        for _ in range(4):  # a steady step: one that recorded no graph (a step widening past 64 columns records)
            recorded = graphs.recorded if graphs is not None else 0
            step = _profiled(batch.advance)
            if graphs is None or graphs.recorded == recorded:
                break
        ids = torch.tensor([[prompt[-1]] for prompt in prompts], device=engine.device)
        model(input_ids=ids)  # warm at this shape
        forward = _profiled(lambda: model(input_ids=ids))
    counts = {"aten_ops_per_decode_step": step["aten_ops"], "aten_ops_per_forward": forward["aten_ops"]}
    if "kernel_launches" in step:
        counts["kernel_launches_per_decode_step"] = step["kernel_launches"]
        counts["kernel_launches_per_forward"] = forward["kernel_launches"]
    return counts


def _second_turn(directory: Path, model, tokenizer, *, device: str, rows: int = 8, new_tokens: int = 4) -> dict:
    """A tool call's second turn, as demo-smollm's tool template asks it: a group of `rows` samples answers one
    prompt (with the tool instructions), then each row asks again with its own call and the tool's result
    appended. Timed: the second turn, on an engine that kept the first prompt (prefix_cache.py) and on one that
    did not."""
    from workers.rl.engines import GenerationRequest
    from workers.rl.engines.hf import TransformersEngine
    from workers.rl.models.chat_formats import HFChat
    from workers.rl.rollout.tools import RUN_PYTHON_TOOL

    chat = HFChat(tokenizer)
    messages = [{"role": "user", "content": "What is 48 * 96 + 289? Use the run_python tool."}]
    first = chat.prompt(messages, [RUN_PYTHON_TOOL])
    seconds = []
    for row in range(rows):  # each row's call as it sampled it, ended by its stop token, then the tool's answer
        call = (f'<tool_call>\n{{"name": "run_python", "arguments": {{"code": "print(48 * 96 + {289 + row})"}}}}'
                "\n</tool_call>")
        seconds.append(first + tokenizer.encode(call, add_special_tokens=False) + [chat.stop_ids[0]]
                       + chat.continuation(messages + [{"role": "assistant", "content": call}],
                                           [{"role": "tool", "content": str(48 * 96 + 289 + row)}], [RUN_PYTHON_TOOL]))
    timings = {}
    for keep in (True, False):
        engine = TransformersEngine(str(directory), device=device, shared_model=model, keep_prompts=keep)
        try:
            engine.generate([GenerationRequest(first, rows, new_tokens, chat.stop_ids, seed=0)])
            _synchronize(device)
            started = time.perf_counter()
            engine.generate([GenerationRequest(prompt, 1, new_tokens, chat.stop_ids, seed=1 + row)
                             for row, prompt in enumerate(seconds)])
            _synchronize(device)
            timings[keep] = time.perf_counter() - started
        finally:
            engine.close()
    return {"rows": rows, "first_prompt_tokens": len(first),
            "added_tokens_mean": round(sum(len(p) - len(first) for p in seconds) / rows, 1),
            "seconds_prompt_kept": round(timings[True], 3), "seconds_prompt_not_kept": round(timings[False], 3),
            "speedup_prompt_kept": round(timings[False] / timings[True], 2)}


def _speculation(directory: Path, model, workloads: dict[str, list[list[int]]], *, device: str, new_tokens: int,
                 stop_ids, temperature: float, passes: int = 2) -> dict:
    """Per workload: ours with speculation (Speculation's defaults: 4 drafts a row) and without, taking turns
    (`_speculation`'s part of the module's docstring)."""
    from workers.rl.engines import GenerationRequest
    from workers.rl.engines.hf import TransformersEngine
    from workers.rl.engines.speculation import OFF, Speculation

    def run_all(engine, prompts) -> tuple[int, float]:
        results = [None] * len(prompts)

        def ask(index):
            results[index] = engine.generate([GenerationRequest(prompts[index], 1, new_tokens, stop_ids, temperature,
                                                                seed=index)])[0][0]

        threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(prompts))]
        _synchronize(device)
        started = time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        _synchronize(device)
        return sum(len(completion.token_ids) for completion in results), time.perf_counter() - started

    figures = {}
    for name, prompts in workloads.items():
        engines = {side: TransformersEngine(str(directory), device=device, shared_model=model,
                                            max_batch_rows=max(len(prompts), 512),
                                            speculation=OFF if side == "without" else Speculation())
                   for side in ("without", "with")}

        def measure(side, engines=engines, prompts=prompts):
            return run_all(engines[side], prompts)

        try:
            figures[name] = {"requests": len(prompts),
                             "prompt_tokens_mean": round(sum(map(len, prompts)) / len(prompts)),
                             **speculation_taking_turns(measure, engines["with"], passes=passes)}
        finally:
            for engine in engines.values():
                engine.close()
    return figures


def speculation_taking_turns(measure, speculating_engine, *, passes: int) -> dict:
    """`measure(side)` -> (tokens, seconds) of one round on the side "without" speculation or "with" it: once each
    untimed (allocations, the prompts kept), then `passes` rounds taking turns. Returns each side's rate, their
    ratio and what `speculating_engine` drafted and accepted in the timed rounds (`bench engine` and `bench serve`)."""
    sides = ("without", "with")
    for side in sides:
        measure(side)
    before = speculating_engine.speculation_stats.as_dict()
    totals = {side: [0, 0.0] for side in sides}
    for _ in range(passes):
        for side in sides:
            tokens, seconds = measure(side)
            totals[side][0] += tokens
            totals[side][1] += seconds
    after = speculating_engine.speculation_stats.as_dict()
    drafted = after["drafted_tokens"] - before["drafted_tokens"]
    accepted = after["accepted_tokens"] - before["accepted_tokens"]
    rates = {side: _rate(*totals[side]) for side in sides}
    return {"passes": passes, "without_speculation": rates["without"], "with_speculation": rates["with"],
            "speedup": round(rates["with"]["tokens_per_second"] / max(rates["without"]["tokens_per_second"], 1e-9), 2),
            "drafted_tokens": drafted, "accepted_tokens": accepted,
            "acceptance_rate": round(accepted / drafted, 3) if drafted else None,
            "verify_steps": after["verify_steps"] - before["verify_steps"]}


def measure_engine(*, device: str, dtype: str, concurrency: list[int], new_tokens: int, random_weights: bool,
                   model_dir: str | None, compare: list[str], temperature: float = 1.0,
                   second_turn: bool = False, cuda_graphs: bool | None = None,
                   repository_prompts: list[list[int]] | None = None, speculation_rows: int = 16) -> dict:
    """Ours beside `compare` (generate, generate_batch) at each concurrency, with each one's operator counts, and
    with `second_turn` a tool call's second turn with its first prompt kept and not (`_second_turn`).
    `cuda_graphs` (None: on a CUDA device): ours with decode graphs and without, and the two against each other;
    on a CPU the graphs' padded steps run eagerly (the GPU check's dry run exercises this code so).
    `repository_prompts` (token ids of the repository conversations): speculative decoding measured on them and on
    `speculation_rows` short answers (`_speculation`).
    `model_dir`: a Hugging Face model directory (config and tokenizer; weights too unless `random_weights`)."""
    from transformers import AutoTokenizer

    from workers.rl.engines.hf import TransformersEngine
    from workers.rl.models.chat_formats import HFChat

    if model_dir is None:
        raise ValueError("measure_engine needs model_dir: a Hugging Face model directory (config and tokenizer)")
    directory = Path(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(directory)
    model = load_model(directory, device=device, dtype=dtype, random_weights=random_weights)
    stop_ids = HFChat(tokenizer).stop_ids
    result = {"model": directory.name, "device": device, "dtype": dtype, "random_weights": random_weights,
              "new_tokens": new_tokens, "temperature": temperature, "torch_threads": torch.get_num_threads(),
              "by_concurrency": {}}
    comparisons = {"generate": _generate, "generate_batch": _generate_batch}
    graphs = device.startswith("cuda") if cuda_graphs is None else cuda_graphs
    for count in concurrency:
        prompts = _prompts(tokenizer, count)
        figures = {}
        for recorded in ((True, False) if graphs else (False,)):
            engine = TransformersEngine(str(directory), device=device, shared_model=model,
                                        max_batch_rows=max(count, 512), cuda_graphs=recorded)
            suffix = "" if recorded == graphs else "_without_cuda_graphs"
            try:
                counts = _step_counts(engine, model, prompts, stop_ids=stop_ids)
                figures.update({key if key.endswith("_forward") else key + suffix: value
                                for key, value in counts.items()})
                figures["ours" + suffix] = _ours(engine, prompts, new_tokens=new_tokens, stop_ids=stop_ids,
                                                 temperature=temperature, warm_pass=graphs)
                if recorded:
                    figures["cuda_graphs"] = engine.decode_graphs.stats()
            finally:
                engine.close()
        if graphs:
            figures["speedup_of_cuda_graphs"] = round(
                figures["ours"]["tokens_per_second"]
                / max(figures["ours_without_cuda_graphs"]["tokens_per_second"], 1e-9), 2)
        for name in compare:
            try:
                figures[name] = comparisons[name](model, tokenizer, prompts, device=device, new_tokens=new_tokens,
                                                  stop_ids=stop_ids, temperature=temperature)
                figures[f"speedup_vs_{name}"] = round(figures["ours"]["tokens_per_second"]
                                                      / max(figures[name]["tokens_per_second"], 1e-9), 2)
            except Exception as error:  # noqa: BLE001 — a peer that cannot run here is reported, not fatal
                figures[name] = {"error": f"{type(error).__name__}: {error}"[:500]}
        result["by_concurrency"][str(count)] = figures
    if graphs:
        result["cuda_graphs_against_eager"] = _graphs_against_eager(directory, model, _prompts(tokenizer, 13),
                                                                    device=device)
    if second_turn:
        result["second_turn"] = _second_turn(directory, model, tokenizer, device=device)
    if repository_prompts:
        result["speculation"] = _speculation(
            directory, model,
            {"repository": repository_prompts, "short_answers": _prompts(tokenizer, speculation_rows)},
            device=device, new_tokens=new_tokens, stop_ids=stop_ids, temperature=temperature)
    return result


def _graphs_against_eager(directory: Path, model, prompts, *, device: str, steps: int = 32) -> dict:
    """The same greedy rows decoded by replayed CUDA graphs and by the same padded steps run eagerly, in lockstep:
    the largest absolute difference of the two batches' logits while every row's tokens still agree, beside the
    logits' own scale. 13 rows (16 a step), each asking a different number of tokens, so that rows leave, the
    steps' rows change buckets and graphs are recorded as the batch shrinks. Both sides pad alike: what differs
    is only the replay."""
    from workers.rl.engines.decode_graphs import DecodeGraphs
    from workers.rl.engines.hf import TransformersEngine
    from workers.rl.engines.sampling import SamplingRequest

    engines = [TransformersEngine(str(directory), device=device, shared_model=model, cuda_graphs=recorded)
               for recorded in (True, False)]
    engines[1].decode_graphs = DecodeGraphs(device, record=False)
    try:
        batches = [engine._open_batch() for engine in engines]
        tokens = [{}, {}]
        difference, scale, compared, agree = 0.0, 0.0, 0, True
        with torch.no_grad():
            for batch in batches:
                batch.admit([(SamplingRequest(prompt, 1, steps - 2 * (index % 8), (), 0.0), index)
                             for index, prompt in enumerate(prompts)])
            while agree and len(batches[0]):
                used = len(batches[0].occupant)
                first, second = (batch.last[:used].float() for batch in batches)
                difference = max(difference, (first - second).abs().max().item())
                scale = max(scale, second.abs().max().item())
                compared += 1
                for side, batch in enumerate(batches):
                    tokens[side].update({entry["handle"]: entry["tokens"] for entry in batch.advance()})
                    tokens[side].update({entry["handle"]: [list(t) for t in entry["tokens"]]
                                         for entry in batch.entries})
                agree = tokens[0] == tokens[1] and len(batches[0]) == len(batches[1])
        return {"rows": len(prompts), "graph_rows": engines[0].decode_graphs.rows(len(prompts)),
                "steps_compared": compared, "tokens_agreed_throughout": agree,
                "max_abs_logit_difference": difference, "max_abs_logit": scale,
                "cuda_graphs": engines[0].decode_graphs.stats()}
    finally:
        for engine in engines:
            engine.close()


def run(*, models_dir: Path, concurrency: tuple[int, ...] = (8, 32), new_tokens: int = 64, device: str = "cpu",
        dtype: str = "fp32", random_weights: bool = False, compare: list[str] | None = None,
        repository_conversations: list | None = None, **_) -> dict:
    """`repository_conversations`: [(messages, tools)] of the repository workload (`bench` builds them)."""
    from transformers import AutoTokenizer

    from workers.rl.models.chat_formats import HFChat
    from workers.rl.models.packaged import SMOLLM2_135M, converted

    if compare is None:  # transformers' generate_batch is made for GPUs: on the CPU it mostly waits
        compare = ["generate", "generate_batch"] if device == "cuda" else ["generate"]
    directory = converted(SMOLLM2_135M, models_dir)
    chat = HFChat(AutoTokenizer.from_pretrained(directory))
    repository = [chat.prompt(messages, tools) for messages, tools in repository_conversations or ()]
    result = measure_engine(device=device, dtype=dtype, concurrency=list(concurrency), new_tokens=new_tokens,
                            random_weights=random_weights, model_dir=str(directory),
                            compare=list(compare), second_turn=True, repository_prompts=repository)
    result["model"] = SMOLLM2_135M.name
    return result

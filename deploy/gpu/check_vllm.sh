#!/usr/bin/env bash
# The vLLM launcher (workers/rl/serving/vllm_server.py) on a GPU machine, end to end through the studio's own client
# (engines/server.py ServerEngine): start it on a small local Hugging Face model, generate from token ids, publish
# perturbed weights to the blob storage and have the server load them (POST /v1/weights), check the answers'
# policy_version and that the greedy output or its logprobs changed, publish the original weights again and check
# the first output comes back (the names mapped and every tensor loaded), check a stream's chunks and a refused
# load. Prints one JSON summary; exits 1 if a check failed. About 2-5 minutes on one GPU; no internet needed.
#
#   deploy/gpu/check_vllm.sh [HF_MODEL_DIR]     (default: a tiny random Llama made here by workers/rl/models/hf_tiny.py)
#
# vLLM must already be installed (GPU workers: pip install -r requirements/gpu.txt, vllm==0.34.0); without it the
# script says so and exits 0. PYTHON (default python) and PORT (default 8765) may be set.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python}
PORT=${PORT:-8765}
if ! "$PY" -c "import vllm" 2>/dev/null; then
    echo '{"check": "vllm_server", "skipped": "vLLM is not installed here (GPU workers install requirements/gpu.txt); nothing checked"}'
    exit 0
fi
WORK=$(mktemp -d)
MODEL=${1:-$WORK/tiny-llama}
if [ -z "${1:-}" ]; then
    "$PY" -c "import sys; from workers.rl.models.hf_tiny import make_tiny_hf_model as m; m(sys.argv[1], hidden_size=256, layers=2, heads=4, max_positions=1024)" "$MODEL"
fi
export STUDIO_SERVE_WEIGHTS_TOKEN=check-token  # and vLLM's --api-key: the engine sends one token to both
timeout 570 "$PY" -m workers.rl.serving.vllm_server --model "$MODEL" --host 127.0.0.1 --port "$PORT" --api-key check-token \
    --gpu-memory-utilization 0.3 --max-model-len 1024 --enforce-eager >"$WORK/server.log" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null || true; wait $SERVER 2>/dev/null || true; rm -rf "$WORK"' EXIT

status=0
timeout 540 "$PY" - "$MODEL" "$PORT" "$WORK" "$SERVER" <<'EOF' || status=$?
import json
import os
import sys
import time
import urllib.error
import urllib.request

import torch
from safetensors.torch import save_file

from workers.rl.engines import GenerationRequest
from workers.rl.engines.server import ServerEngine, ServerError
from workers.rl.models.policies import HFPolicy
from workers.storage import Storage

model, port, work, server = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
root, token = f"http://127.0.0.1:{port}", "check-token"
summary, checks = {"check": "vllm_server", "model": model}, {}


def http(path, body=None, stream=False):
    request = urllib.request.Request(root + path, data=None if body is None else json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json", "Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, timeout=120) as reply:
        text = reply.read().decode()
    return text if stream else json.loads(text)


started = time.monotonic()
while True:
    try:
        urllib.request.urlopen(root + "/health", timeout=5)
        break
    except (urllib.error.URLError, OSError):
        try:
            os.kill(server, 0)
        except OSError:
            sys.exit(print(open(f"{work}/server.log").read()[-4000:]) or 3)
        if time.monotonic() - started > 400:
            sys.exit(print("the server did not come up in 400 s") or 3)
        time.sleep(2)
summary["startup_seconds"] = round(time.monotonic() - started, 1)

policy = HFPolicy(model)  # the trainer's side: its names are what the pipeline publishes
original = policy.inference_state()
prompt = policy.tokenizer("The capital of France is")["input_ids"]
engine = ServerEngine([f"{root}/v1"], weights=Storage(f"{work}/weights"), token=token, max_staleness=0,
                      timeout_seconds=120, retries=0)


def greedy():
    [[completion]] = engine.generate([GenerationRequest(list(prompt), 1, 24, (), temperature=0.0)])
    assert completion.finish_reason != "error", completion.error
    return completion


def sampled():
    [[completion]] = engine.generate([GenerationRequest(list(prompt), 1, 24, (), temperature=1.0, seed=7)])
    assert completion.finish_reason != "error", completion.error
    return completion


def load(state, version):
    began = time.monotonic()
    engine.load_weights(state, version)
    return round(time.monotonic() - began, 2)


try:
    first, first_sampled = greedy(), sampled()
    checks["version_0_answered"] = first.policy_version == 0 and len(first.token_ids) > 0
    checks["get_weights_0"] = http("/v1/weights")["policy_version"] == 0
    torch.manual_seed(0)
    perturbed = {k: v + 0.05 * torch.randn_like(v) if v.ndim == 2 else v for k, v in original.items()}
    summary["load_seconds_v1"] = load(perturbed, 1)
    second, second_sampled = greedy(), sampled()
    checks["version_1_answered"] = second.policy_version == 1 and second_sampled.policy_version == 1
    checks["output_changed"] = second.token_ids != first.token_ids or second_sampled.logprobs != first_sampled.logprobs
    summary["greedy_tokens_v0_v1"] = [first.token_ids[:8], second.token_ids[:8]]
    events = [e for e in http("/v1/completions", {"prompt": prompt, "max_tokens": 4, "stream": True},
                              stream=True).split("\n\n") if e.startswith("data: {")]
    checks["stream_chunks_versioned"] = bool(events) and all(
        json.loads(e[6:]).get("policy_version") == 1 for e in events)
    summary["load_seconds_v2"] = load(original, 2)
    third, third_sampled = greedy(), sampled()
    checks["version_2_answered"] = third.policy_version == 2
    checks["original_output_back"] = third.token_ids == first.token_ids
    diff = max((abs(a - b) for a, b in zip(third_sampled.logprobs, first_sampled.logprobs, strict=False)), default=0.0)
    summary["max_logprob_diff_v2_v0"] = round(diff, 5)
    checks["original_logprobs_back"] = third_sampled.token_ids == first_sampled.token_ids and diff < 0.05
    checks["json_versioned"] = http("/v1/completions", {"prompt": prompt, "max_tokens": 2}).get("policy_version") == 2
    checks["chat_versioned"] = policy.tokenizer.chat_template is None or http(
        "/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
    ).get("policy_version") == 2
    bad = Storage(f"{work}/weights")
    staging = bad.stage("bad")
    save_file({"model.embed_tokens.weight": torch.zeros(3)}, str(staging / "model.safetensors"))
    bad.publish("bad", staging)
    try:
        engine._post(f"{root}/v1/weights", {"location": bad.url_of("bad"), "policy_version": 3}, token=token)
        checks["misfit_refused"] = False
    except ServerError as exc:
        checks["misfit_refused"] = "HTTP 400" in str(exc)
    checks["version_still_2"] = http("/v1/weights")["policy_version"] == 2
except Exception as exc:  # a failed step is a failed check, reported with the rest
    summary["error"] = f"{type(exc).__name__}: {exc}"[:2000]
summary["checks"], summary["ok"] = checks, bool(checks) and all(checks.values()) and "error" not in summary
print(json.dumps(summary, indent=2))
sys.exit(0 if summary["ok"] else 1)
EOF
if [ "$status" -ne 0 ]; then
    echo "--- the server's log (last lines) ---" >&2
    tail -n 60 "$WORK/server.log" >&2 || true
fi
exit "$status"

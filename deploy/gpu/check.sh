#!/usr/bin/env bash
# The prepared GPU check of issue 27 (docs/GPU.md): on a lent GPU machine, from the repository root, in one call,
# with no internet, no Django and no database. It installs what the machine lacks from the carried wheels
# (gpu/whl, made here by deploy/gpu/bundle.sh) into /tmp/gpu-site, then runs benchmarks.engine.gpu_check on the
# carried SmolLM2 config and tokenizer (gpu/model; random weights): engine and trainer, fp32 and bf16, against
# generate / generate_batch / TRL, and vLLM where `import vllm` works. Everything ends within GPU_CHECK_SECONDS
# (350; 900 for the dry run) of the start, installs included; each part is a JSON line on stdout and in
# $OUT/gpu-check.jsonl, $OUT/gpu-check.json holds them all, the libraries' stderr goes to $OUT/gpu-check-stderr.log.
# Arguments go to the check (--only engine_bf16,trainer_fp32_*, --compare generate; see its --help).
#
#   deploy/gpu/check.sh                       on the GPU machine (python3 there holds CUDA torch)
#   GPU_CHECK_DRY=1 deploy/gpu/check.sh       here, on the CPU: a 2-layer model, tiny sizes (.venv's python)
set -uo pipefail
cd "$(dirname "$0")/../.."
started=$SECONDS
DRY=${GPU_CHECK_DRY:-0}
TOTAL=${GPU_CHECK_SECONDS:-$([ "$DRY" = 1 ] && echo 900 || echo 350)}  # a dry run on two busy CPU cores: ~5 min
export OUT="${OUT:-/tmp/gpu-check}"
mkdir -p "$OUT"
MODEL=${GPU_CHECK_MODEL:-gpu/model}
if [ "$DRY" = 1 ]; then
    PY=${PYTHON:-.venv/bin/python}
else
    PY=${PYTHON:-python3}
    if compgen -G "gpu/whl/*.whl" >/dev/null; then
        # --no-deps: the folder names every wheel it needs; --target: the machine's own site-packages stay as they
        # are, the carried versions come first on PYTHONPATH.
        if ! "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/gpu-site \
                gpu/whl/*.whl >"$OUT/install.log" 2>&1; then
            echo '{"part": "install", "error": "pip could not install gpu/whl (see install.log)"}'
            tail -n 20 "$OUT/install.log"
            exit 2
        fi
        export PYTHONPATH="/tmp/gpu-site${PYTHONPATH:+:$PYTHONPATH}"
        echo "{\"part\": \"install\", \"wheels\": $(ls gpu/whl/*.whl | wc -l), \"seconds\": $((SECONDS - started))}"
    else
        echo '{"part": "install", "note": "no gpu/whl/*.whl carried: the machine'"'"'s own packages are used"}'
    fi
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
left=$((TOTAL - (SECONDS - started)))
# The check's own time guard ends its parts 15 s before the hard stop; the hard stop keeps the call bounded.
PYTHONUNBUFFERED=1 timeout --kill-after=5 "$((left - 5))" "$PY" -m benchmarks.engine.gpu_check --model "$MODEL" \
    --out "$OUT" --deadline "$((left - 20))" $([ "$DRY" = 1 ] && echo --dry) "$@" 2>"$OUT/gpu-check-stderr.log"
status=$?
if [ $status -ne 0 ]; then
    echo "{\"part\": \"check\", \"exit_status\": $status, \"seconds\": $((SECONDS - started))}"
    tail -n 30 "$OUT/gpu-check-stderr.log"
fi
exit $status

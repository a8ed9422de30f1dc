#!/usr/bin/env bash
# What only a real GPU can show (NVIDIA, compute capability >= 8.0, a CUDA 13 driver):
#   scripts/cuda_check.sh OUT
# 1. .venv (make setup: CPU onnxruntime and the exporter stack) exports the embedded SmolLM2 for the
#    GPU (export --device cuda) and as fp32 GQA for the CPU reference, into artifacts/;
# 2. .venv-gpu gets the gpu extra (onnxruntime-gpu with its CUDA 13 / cuDNN 9 packages) and the
#    test tools, never beside onnxruntime. Offline, ONNXSAMPLE_GPU_WHEEL=path/to/onnxruntime_gpu.whl
#    installs that wheel alone instead (the CUDA / cuDNN packages must then already be installed);
# 3. runs the tests marked `cuda` (tests/cuda: greedy tokens against the CPU's fp32 export within
#    the documented fp16 tolerance, CUDA graphs and the static chain against the branching chain,
#    sampled draws under identical uniforms) and the GPU benchmark (benchmarks/gpu.py: decode tok/s
#    at batch 1, 8, 32, 64 for the branching chain, the static chain with CUDA graphs, and the plain
#    model with host sampling), writing OUT/cuda-tests.xml, OUT/cuda-tests.log and OUT/gpu.json.
set -euo pipefail
OUT=$(mkdir -p "${1:?usage: scripts/cuda_check.sh OUT}" && cd "$1" && pwd)
cd "$(dirname "$0")/.."

cap=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1)
awk -v c="$cap" 'BEGIN { exit !(c >= 8.0) }' || { echo "needs compute capability >= 8.0, found $cap"; exit 1; }

make setup
.venv/bin/onnxsample export --device cuda -o artifacts/smollm2-135m-instruct-gqa-gguf-cuda
.venv/bin/onnxsample export --layout gqa --precision fp32 -o artifacts/smollm2-135m-instruct-gqa-fp32

GPU_VENV=.venv-gpu
[ -x $GPU_VENV/bin/python ] || python3 -m venv $GPU_VENV
if [ -n "${ONNXSAMPLE_GPU_WHEEL:-}" ]; then
  $GPU_VENV/bin/pip install -q --no-deps "$ONNXSAMPLE_GPU_WHEEL"
  $GPU_VENV/bin/pip install -q -c constraints.txt -e . pytest
else
  $GPU_VENV/bin/pip install -q -c constraints.txt -e ".[gpu]" pytest
fi
$GPU_VENV/bin/pip uninstall -q -y onnxruntime 2>/dev/null || true
$GPU_VENV/bin/python -c 'import onnxruntime as o; assert "CUDAExecutionProvider" in o.get_available_providers(), o.get_available_providers()'

status=0
$GPU_VENV/bin/python -m pytest -m cuda -p no:cacheprovider tests/cuda \
  --junitxml "$OUT/cuda-tests.xml" 2>&1 | tee "$OUT/cuda-tests.log" || status=1
$GPU_VENV/bin/python benchmarks/gpu.py --output "$OUT/gpu.json" || status=1
exit $status

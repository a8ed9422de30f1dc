#!/usr/bin/env bash
# What only a real GPU can show (NVIDIA, compute capability >= 8.0, a CUDA 13 driver):
#   scripts/cuda_check.sh OUT
# 1. .venv (make setup: CPU onnxruntime and the exporter stack) exports the embedded SmolLM2 for the
#    GPU (export --device cuda) and as fp32 GQA for the CPU reference, into artifacts/;
# 2. .venv-gpu gets the gpu extra (onnxruntime-gpu with its CUDA 13 / cuDNN 9 packages) and the
#    test tools, never beside onnxruntime. Offline, ONNXSAMPLE_GPU_WHEEL=path/to/onnxruntime_gpu.whl
#    installs that wheel alone instead (the CUDA / cuDNN packages must then already be installed);
#    on a machine with no network at all whose python3 already holds PyTorch and CUDA 13,
#    ONNXSAMPLE_WHEELS=DIR (filled by scripts/cuda_wheels.sh elsewhere) replaces 1 and 2: every wheel
#    of DIR goes into a folder of its own on PYTHONPATH, a preinstalled onnxruntime is removed, and
#    the exports are made there with that python3;
# 3. runs the tests marked `cuda` (tests/cuda: greedy tokens against the CPU's fp32 export within
#    the documented fp16 tolerance, CUDA graphs and the static chain against the branching chain,
#    sampled draws under identical uniforms) and the GPU benchmark (benchmarks/gpu.py: decode tok/s
#    at batch 1, 8, 32, 64 for the branching chain, the static chain with CUDA graphs (sampled and
#    greedy), and the plain model with host sampling, transformers' generate where torch is there;
#    beside llama.cpp's CUDA build of the same GGUF when nvcc is there:
#    scripts/build_llama_cpp.sh cuda, llama-batched-bench) and the sampler alone
#    (benchmarks/gpu_sampler.py, vocabularies of 49,152 and 262,144) and, where torch is there,
#    the kernels of a decode step and the row buckets' tokens (benchmarks/gpu_kernels.py), writing
#    OUT/cuda-tests.xml, OUT/cuda-tests.log, OUT/gpu.json, OUT/gpu_kernels.json,
#    OUT/gpu_sampler.json and OUT/gpu_sampler_262k.json.
set -euo pipefail
OUT=$(mkdir -p "${1:?usage: scripts/cuda_check.sh OUT}" && cd "$1" && pwd)
cd "$(dirname "$0")/.."

cap=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1)
awk -v c="$cap" 'BEGIN { exit !(c >= 8.0) }' || { echo "needs compute capability >= 8.0, found $cap"; exit 1; }

if [ -n "${ONNXSAMPLE_WHEELS:-}" ]; then
  # No network: the machine's python3 (PyTorch, CUDA 13) and the wheels of $ONNXSAMPLE_WHEELS.
  SITE=${ONNXSAMPLE_SITE:-$PWD/.cuda-check-site}
  python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$SITE" \
    "$ONNXSAMPLE_WHEELS"/*.whl
  python3 -m pip uninstall -q -y onnxruntime 2>/dev/null || true
  export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH}
  for lib in /usr/local/cuda/lib64 /usr/local/cuda-13.0/lib64 /usr/local/nvidia/lib64; do
    [ -d $lib ] && export LD_LIBRARY_PATH=$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  done
  PYTHON="python3 -P"  # -P: the installed package, not this checkout's unmapped source folders
  $PYTHON -m onnxsample export --device cuda -o artifacts/smollm2-135m-instruct-gqa-fp16-cuda
  $PYTHON -m onnxsample export --layout gqa --precision fp32 -o artifacts/smollm2-135m-instruct-gqa-fp32
  BENCH_PYTHON=python3
else
  make setup
  .venv/bin/onnxsample export --device cuda -o artifacts/smollm2-135m-instruct-gqa-fp16-cuda
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
  PYTHON=$GPU_VENV/bin/python
  BENCH_PYTHON=$PYTHON
fi
$PYTHON -c 'import onnxruntime as o; assert "CUDAExecutionProvider" in o.get_available_providers(), o.get_available_providers()'

status=0
$PYTHON -m pytest -m cuda -p no:cacheprovider tests/cuda \
  --junitxml "$OUT/cuda-tests.xml" 2>&1 | tee "$OUT/cuda-tests.log" || status=1
peer=()
if command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH=$PATH:/usr/local/cuda/bin
  if llama=$(PYTHON=$BENCH_PYTHON bash scripts/build_llama_cpp.sh cuda); then
    peer=(--llama-batched-bench "$llama/build-cuda/bin/llama-batched-bench")
  else
    echo "llama.cpp's CUDA build failed: gpu.json has no llama.cpp rows"; status=1
  fi
else
  echo "no nvcc: gpu.json has no llama.cpp rows"
fi
# transformers' generate beside them, where the Python that benchmarks holds torch and transformers
$BENCH_PYTHON -c 'import torch, transformers' 2>/dev/null && peer+=(--transformers)
$BENCH_PYTHON benchmarks/gpu.py --output "$OUT/gpu.json" "${peer[@]}" || status=1
# where a step's time goes (torch's profiler over CUPTI) and whether tokens follow the row bucket
if $BENCH_PYTHON -c 'import torch' 2>/dev/null; then
  $BENCH_PYTHON benchmarks/gpu_kernels.py --output "$OUT/gpu_kernels.json" || status=1
else
  echo "no torch beside onnxruntime-gpu: no gpu_kernels.json"
fi
for vocab in 49152 262144; do
  name=gpu_sampler$([ $vocab = 49152 ] || echo _262k)
  $BENCH_PYTHON benchmarks/gpu_sampler.py build "$OUT/$name" --vocab $vocab &&
    $BENCH_PYTHON benchmarks/gpu_sampler.py run "$OUT/$name" --output "$OUT/$name.json" || status=1
done
exit $status

#!/usr/bin/env bash
# Build llama.cpp from the sources the llama-cpp-python sdist carries (PyPI is the only source
# reachable here): llama-server (benchmarks, greedy text and logprobs for the GGUF tests),
# llama-tokenize (the tokenizer oracle), llama-quantize (the test GGUFs' K-quant mixes) and
# llama-batched-bench (the GPU benchmark's peer, checked here on the CPU). Its
# converter, convert_hf_to_gguf.py, and the gguf-py it imports come with the sources.
#
# Built once into the user cache, keyed by the sdist's version, and reused by every clone:
#   ${ONNXSAMPLE_CACHE:-~/.cache/onnxsample}/llama.cpp-$VERSION/{src,build/bin}
# ~15 min on 2 cores. Prints the folder.
#
# `build_llama_cpp.sh cuda` (a GPU machine with nvcc) builds llama.cpp's CUDA backend instead, for
# the GPU benchmark's peer: llama-batched-bench and llama-bench in build-cuda/bin, for the
# architectures in CUDA_ARCHITECTURES (default 90: H100, H200).
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=0.3.36
ROOT=${ONNXSAMPLE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/onnxsample}/llama.cpp-$VERSION
TARGETS=(llama-server llama-tokenize llama-quantize llama-batched-bench)
BUILD=build
# Native, without AMX: where a CPU has AMX but the sandbox or kernel does not grant its tiles,
# ggml's AMX kernels stop llama-server with SIGILL on the first matmul.
NO_AMX="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
FLAGS=(-DGGML_NATIVE=ON "-DCMAKE_C_FLAGS=$NO_AMX" "-DCMAKE_CXX_FLAGS=$NO_AMX")
if [ "${1:-}" = cuda ]; then
  TARGETS=(llama-batched-bench llama-bench)
  BUILD=build-cuda
  FLAGS=(-DGGML_NATIVE=OFF -DGGML_CUDA=ON "-DCMAKE_CUDA_ARCHITECTURES=${CUDA_ARCHITECTURES:-90}")
fi
done_=1
for t in "${TARGETS[@]}"; do [ -x "$ROOT/$BUILD/bin/$t" ] || done_=0; done
# a build made with other flags (an older script's) is made again
[ "$(cat "$ROOT/$BUILD/flags" 2>/dev/null)" = "${FLAGS[*]}" ] || done_=0
if [ "$done_" = 1 ] && [ -f "$ROOT/src/convert_hf_to_gguf.py" ]; then echo "$ROOT"; exit 0; fi
mkdir -p "$ROOT"
PY=${PYTHON:-.venv/bin/python}
if [ ! -f "$ROOT/src/convert_hf_to_gguf.py" ]; then
  rm -rf "$ROOT/sdist"
  $PY -m pip download -q --no-deps --no-binary :all: --dest "$ROOT/sdist" "llama-cpp-python==$VERSION"
  tar -xzf "$ROOT"/sdist/llama_cpp_python-*.tar.gz -C "$ROOT/sdist"
  rm -rf "$ROOT/src"
  mv "$ROOT"/sdist/llama_cpp_python-*/vendor/llama.cpp "$ROOT/src"
  rm -rf "$ROOT/sdist"
fi
echo "build_llama_cpp: building ${TARGETS[*]} in $ROOT/$BUILD (~15 min on 2 cores)" >&2
cmake -S "$ROOT/src" -B "$ROOT/$BUILD" "${FLAGS[@]}" -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
  -DCMAKE_BUILD_TYPE=Release > "$ROOT/cmake-$BUILD.log"
cmake --build "$ROOT/$BUILD" --target "${TARGETS[@]}" -j"$(nproc)" > "$ROOT/$BUILD.log"
echo "${FLAGS[*]}" > "$ROOT/$BUILD/flags"
echo "$ROOT"

#!/usr/bin/env bash
# Build llama.cpp from the sources the llama-cpp-python sdist carries (PyPI is the only source
# reachable here): llama-server (benchmarks, greedy text and logprobs for the GGUF tests),
# llama-tokenize (the tokenizer oracle) and llama-quantize (the test GGUFs' K-quant mixes). Its
# converter, convert_hf_to_gguf.py, and the gguf-py it imports come with the sources.
#
# Built once into the user cache, keyed by the sdist's version, and reused by every clone:
#   ${ONNXSAMPLE_CACHE:-~/.cache/onnxsample}/llama.cpp-$VERSION/{src,build/bin}
# ~15 min on 2 cores. Prints the folder.
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=0.3.36
ROOT=${ONNXSAMPLE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/onnxsample}/llama.cpp-$VERSION
TARGETS=(llama-server llama-tokenize llama-quantize)
done_=1
for t in "${TARGETS[@]}"; do [ -x "$ROOT/build/bin/$t" ] || done_=0; done
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
echo "build_llama_cpp: building ${TARGETS[*]} in $ROOT/build (~15 min on 2 cores)" >&2
cmake -S "$ROOT/src" -B "$ROOT/build" -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
  -DCMAKE_BUILD_TYPE=Release > "$ROOT/cmake.log"
cmake --build "$ROOT/build" --target "${TARGETS[@]}" -j"$(nproc)" > "$ROOT/build.log"
echo "$ROOT"

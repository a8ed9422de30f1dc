#!/usr/bin/env bash
# Build llama.cpp's llama-server from the sources the llama-cpp-python sdist carries (PyPI is the
# only source reachable here), for benchmarks/serve.py. ~15 min on 2 cores; the binary lands in
# artifacts/llama.cpp/build/bin/llama-server and is reused.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=artifacts/llama.cpp
BIN=$OUT/build/bin/llama-server
if [ -x "$BIN" ]; then echo "build_llama_server: $BIN is there"; exit 0; fi
mkdir -p "$OUT"
PY=${PYTHON:-.venv/bin/python}
$PY -m pip download -q --no-deps --no-binary :all: --dest "$OUT/sdist" "llama-cpp-python==0.3.36"
tar -xzf "$OUT"/sdist/llama_cpp_python-*.tar.gz -C "$OUT/sdist"
SRC=$(ls -d "$OUT"/sdist/llama_cpp_python-*/vendor/llama.cpp)
cmake -S "$SRC" -B "$OUT/build" -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DCMAKE_BUILD_TYPE=Release > "$OUT/cmake.log"
cmake --build "$OUT/build" --target llama-server -j"$(nproc)" > "$OUT/build.log"
echo "build_llama_server: built $BIN"

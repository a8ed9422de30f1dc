#!/usr/bin/env bash
# .venv-llamacpp: llama-cpp-python (the benchmarks' in-process llama.cpp peer) without compiling
# llama.cpp a second time. Its Python bindings come from the same sdist as the llama.cpp that
# scripts/build_llama_cpp.sh builds into the user cache, and load that build's libllama through
# LLAMA_CPP_LIB_PATH, which a .pth file sets on start. Prints the interpreter.
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=0.3.36
LLAMA=$(bash scripts/build_llama_cpp.sh)
VENV=.venv-llamacpp
PY=${PYTHON:-python3}
if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c "import llama_cpp" 2>/dev/null; then
  echo "$VENV/bin/python"; exit 0
fi
rm -rf "$VENV"
$PY -m venv "$VENV"
"$VENV/bin/pip" install -q -c constraints.txt numpy typing-extensions diskcache jinja2
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
"$VENV/bin/pip" download -q --no-deps --no-binary :all: --dest "$TMP" "llama-cpp-python==$VERSION"
tar -xzf "$TMP"/llama_cpp_python-*.tar.gz -C "$TMP" --wildcards '*/llama_cpp/*'
SITE=$("$VENV/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
cp -r "$TMP"/llama_cpp_python-*/llama_cpp "$SITE/"
echo "import os; os.environ.setdefault('LLAMA_CPP_LIB_PATH', '$LLAMA/build/bin')" > "$SITE/llama_cpp_lib.pth"
"$VENV/bin/python" -c "import llama_cpp; llama_cpp.llama_backend_init()" >&2
echo "$VENV/bin/python"

#!/usr/bin/env bash
# Build the embedded SmolLM2-135M-Instruct with onnxruntime-genai's model builder, for the tests that
# check the composer on genai's graph layout (GroupQueryAttention, no position_ids):
#   artifacts/cache/genai-smollm2-fp32/{model.onnx, model.onnx.data, genai_config.json, tokenizer...}
#
# The builder needs transformers 5.x while the project pins transformers 4.57.6, so it runs from its own
# virtual environment, .venv-genai (git-ignored); the main .venv is never touched.
#
# Steps (each one is skipped when its result is already there; rerunning the script is cheap):
#   1. .venv-genai: `python3 -m venv .venv-genai`, then `pip install` the pins below
#      (torch==2.13.0 resolves to the local CPU build; never install torch unpinned: that pulls CUDA).
#      A stamp file holding the pins marks a finished install; changing a pin reinstalls.
#   2. The de-quantised HF folder of the embedded model, with the main venv:
#      `.venv/bin/onnxsample export -o artifacts/cache/smollm2-hf-export --layout optimum --keep-hf`
#      (writes .../hf/ = fp32 safetensors + tokenizer + config beside an optimum model.onnx).
#   3. The builder, offline (HF_HUB_OFFLINE=1), into a staging folder:
#      `.venv-genai/bin/python -m onnxruntime_genai.models.builder \
#           -i artifacts/cache/smollm2-hf-export/hf -o STAGE -p fp32 -e cpu -c STAGE_CACHE`
#      then STAGE is moved to artifacts/cache/genai-smollm2-fp32 in one rename, so a failure never leaves
#      a half-written model where the tests look. The builder's log is kept there as build.log, and
#      build-info.json records the versions used.
# When artifacts/cache/genai-smollm2-fp32/model.onnx exists, the script does nothing at all.
#
# Measured here (2 shared cores): venv ~90 s (1.3 GB), HF export ~120 s (3.6 GB peak RSS, 1.1 GB on
# disk), builder ~8 s (1.2 GB peak RSS, 545 MB on disk).
#
# Environment: PYTHON (interpreter for the new venv, default python3), GENAI_VENV (default .venv-genai),
# MAIN_VENV (default .venv).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

PYTHON="${PYTHON:-python3}"
GENAI_VENV="${GENAI_VENV:-$ROOT/.venv-genai}"
MAIN_VENV="${MAIN_VENV:-$ROOT/.venv}"
CACHE="$ROOT/artifacts/cache"
HF_EXPORT="$CACHE/smollm2-hf-export"
HF_DIR="$HF_EXPORT/hf"
OUT="$CACHE/genai-smollm2-fp32"

# Checked working together on Python 3.11 (the builder's own imports: torch, transformers, onnx,
# onnx_ir, safetensors, numpy, tqdm; the rest pins what those resolve to).
PINS=(
  "onnxruntime-genai==0.18.0"
  "onnxruntime==1.31.1"
  "transformers==5.23.0"
  "tokenizers==0.23.3"
  "huggingface-hub==2.4.0"
  "torch==2.13.0"
  "onnx==1.23.2"
  "onnx-ir==1.1.0"
  "protobuf==7.36.2"
  "safetensors==0.8.0"
  "numpy==2.4.6"
  "tqdm==4.70.1"
)

say() { printf 'build_genai_model: %s\n' "$*"; }

if [[ -f "$OUT/model.onnx" ]]; then
  say "up to date: $OUT/model.onnx exists (delete $OUT to rebuild)"
  exit 0
fi

mkdir -p "$CACHE"
# Another `make test` may be building the same thing: wait for it instead of racing it.
exec 9>"$CACHE/.genai-smollm2-fp32.lock"
flock 9
if [[ -f "$OUT/model.onnx" ]]; then
  say "up to date: built by a concurrent run ($OUT/model.onnx)"
  exit 0
fi

export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1

# 1. The builder's own virtual environment.
STAMP="$GENAI_VENV/.installed-genai"
WANT="$(printf '%s\n' "${PINS[@]}")"
if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$WANT" ]]; then
  say "venv ready: $GENAI_VENV"
else
  t0=$SECONDS
  if [[ ! -x "$GENAI_VENV/bin/python" ]]; then
    say "creating $GENAI_VENV with $PYTHON"
    "$PYTHON" -m venv "$GENAI_VENV"
  fi
  say "installing into $GENAI_VENV: ${PINS[*]}"
  rm -f "$STAMP"
  "$GENAI_VENV/bin/python" -m pip install -q --upgrade pip
  "$GENAI_VENV/bin/python" -m pip install -q "${PINS[@]}"
  "$GENAI_VENV/bin/python" -c "import onnxruntime_genai.models.builder" # fails here, not mid-build
  printf '%s\n' "$WANT" >"$STAMP"
  say "venv installed in $((SECONDS - t0)) s ($(du -sh "$GENAI_VENV" | cut -f1))"
fi

# 2. The embedded model's de-quantised HF folder (the builder cannot read the Q4_1 GGUF).
if [[ -f "$HF_DIR/config.json" && -f "$HF_DIR/model.safetensors" && -f "$HF_DIR/tokenizer.json" ]]; then
  say "HF folder ready: $HF_DIR"
else
  if [[ ! -x "$MAIN_VENV/bin/onnxsample" ]]; then
    say "error: $MAIN_VENV/bin/onnxsample is missing; run 'make setup' first" >&2
    exit 1
  fi
  t0=$SECONDS
  force=()
  # An export there without --keep-hf would be reused as is, without its hf/ folder.
  [[ -e "$HF_EXPORT" ]] && force=(--force)
  say "exporting the embedded model with its HF folder into $HF_EXPORT (~2 min)"
  "$MAIN_VENV/bin/onnxsample" export -o "$HF_EXPORT" --layout optimum --precision fp32 --keep-hf "${force[@]}"
  if [[ ! -f "$HF_DIR/config.json" || ! -f "$HF_DIR/model.safetensors" ]]; then
    say "error: the export wrote no HF folder at $HF_DIR" >&2
    exit 1
  fi
  say "HF folder exported in $((SECONDS - t0)) s"
fi

# 3. The builder, into a staging folder moved into place only when complete.
STAGE="$CACHE/.genai-smollm2-fp32.partial"
BUILD_CACHE="$CACHE/.genai-smollm2-fp32.builder-cache"
rm -rf "$STAGE" "$BUILD_CACHE"
trap 'rm -rf "$STAGE" "$BUILD_CACHE"' EXIT
mkdir -p "$STAGE"
t0=$SECONDS
say "running onnxruntime-genai's builder (fp32, cpu) on $HF_DIR"
if ! "$GENAI_VENV/bin/python" -m onnxruntime_genai.models.builder \
  -i "$HF_DIR" -o "$STAGE" -p fp32 -e cpu -c "$BUILD_CACHE" >"$STAGE.log" 2>&1; then
  say "error: the builder failed; the end of its log:" >&2
  tail -n 30 "$STAGE.log" >&2
  rm -f "$STAGE.log"
  exit 1
fi
mv "$STAGE.log" "$STAGE/build.log"
for f in model.onnx genai_config.json tokenizer.json; do
  if [[ ! -f "$STAGE/$f" ]]; then
    say "error: the builder wrote no $f (see the log above)" >&2
    tail -n 30 "$STAGE/build.log" >&2
    exit 1
  fi
done
"$GENAI_VENV/bin/python" - "$STAGE/build-info.json" "$HF_DIR" <<'EOF'
import importlib.metadata as md
import json
import sys

names = ("onnxruntime-genai", "onnxruntime", "transformers", "torch", "onnx", "onnx-ir")
info = {
    "source": sys.argv[2],
    "command": "python -m onnxruntime_genai.models.builder -i SOURCE -o OUT -p fp32 -e cpu",
    "versions": {n: md.version(n) for n in names},
}
with open(sys.argv[1], "w") as f:
    json.dump(info, f, indent=2)
EOF
mv "$STAGE" "$OUT"
say "built $OUT in $((SECONDS - t0)) s ($(du -sh "$OUT" | cut -f1))"

#!/usr/bin/env bash
# The simulated CUDA device the `cuda_sim` tests run on (make cuda-sim; `make test` builds it):
# onnxruntime-gpu's real host code (provider construction, partitioning, Memcpy insertion, kernel
# constructors, host-side shape checks, CUDA-graph capture) over stand-in CUDA libraries that
# compute nothing. Built in OUT (default .cuda-sim/, git-ignored):
#   OUT/venv          a venv with onnxruntime-gpu==1.31.1 ONLY (never beside onnxruntime), the
#                     project (`pip install --no-deps -e .`) and its base runtime dependencies
#   OUT/cuda-headers  CUDA 13.0 runtime headers from PyPI (nvidia-cuda-runtime + nvidia-cuda-crt,
#                     ~8 MB; the stubs need cudaDeviceProp's exact layout); nothing of theirs loads
#   OUT/lib           stub libcudart.so.13 (fakecudart.c), libcublas.so.13, libcublasLt.so.13,
#                     libcurand.so.10, libcuda.so.1, libcudnn.so.9: every library the CUDA provider
#                     loads, so none of the ~2 GB of NVIDIA wheels is downloaded
#   OUT/env.sh        LD_LIBRARY_PATH etc., to export before starting OUT/venv/bin/python
# Needs gcc, python3 (venv) and PyPI. Cold: ~260 MB download, about a minute; warm: < 1 s (rebuilt
# when this script or fakecudart.c change; the project reinstalled when pyproject.toml changes).
# Usage: scripts/cuda_sim/build.sh [OUT]
set -euo pipefail
SRC=$(cd "$(dirname "$0")" && pwd)
PROJ=$(cd "$SRC/../.." && pwd)
OUT=${1:-$PROJ/.cuda-sim}
ORT_PIN=onnxruntime-gpu==1.31.1
HDR_PINS="nvidia-cuda-runtime==13.0.88 nvidia-cuda-crt==13.0.88"   # ORT 1.31.1 is built for CUDA 13.0
mkdir -p "$OUT"
log="$OUT/build.log"
key=$(cat "$SRC/build.sh" "$SRC/fakecudart.c" | sha256sum | cut -c1-16)

if [ ! -f "$OUT/ready-$key" ]; then
  : >"$log"
  [ -x "$OUT/venv/bin/python" ] || python3 -m venv "$OUT/venv" >>"$log" 2>&1
  VPY="$OUT/venv/bin/python"
  if ! "$VPY" -c 'import importlib.metadata as m, sys; sys.exit(m.version("onnxruntime-gpu") != "1.31.1")' 2>/dev/null; then
    "$VPY" -m pip -q install -U pip >>"$log" 2>&1 || true
    "$VPY" -m pip -q install "$ORT_PIN" >>"$log" 2>&1 || { echo "pip install $ORT_PIN failed (see $log)"; exit 1; }
  fi
  if "$VPY" -c 'import importlib.metadata as m; m.version("onnxruntime")' 2>/dev/null; then
    echo "$OUT/venv has onnxruntime beside onnxruntime-gpu: remove $OUT/venv and rerun"; exit 1
  fi
  if [ ! -f "$OUT/cuda-headers/nvidia/cu13/include/crt/host_defines.h" ]; then
    rm -rf "$OUT/cuda-headers"
    "$VPY" -m pip -q install --no-deps --target "$OUT/cuda-headers" $HDR_PINS >>"$log" 2>&1 \
      || { echo "could not fetch the CUDA headers ($HDR_PINS; see $log)"; exit 1; }
  fi
  INC="$OUT/cuda-headers/nvidia/cu13/include"
  SO=$(ls "$OUT"/venv/lib/python3*/site-packages/onnxruntime/capi/libonnxruntime_providers_cuda.so)
  B="$OUT/build"; L="$OUT/lib"; rm -rf "$B" "$L"; mkdir -p "$B" "$L"
  # symbols the provider imports, by the library (symbol version) it expects them from
  nm -D --undefined-only "$SO" | awk '{print $2}' >"$B/undef.txt"
  want() { grep "@$1\$" "$B/undef.txt" | sed 's/@.*//' | sort -u; }
  # libcudart.so.13: fakecudart.c + a `return cudaSuccess` stub for anything else imported
  gcc -O1 -fPIC -c -I"$INC" -o "$B/fakecudart.o" "$SRC/fakecudart.c" >>"$log" 2>&1 || { echo "fakecudart.c does not compile (see $log)"; exit 1; }
  nm --defined-only "$B/fakecudart.o" | awk '{print $3}' | sort -u >"$B/have.txt"
  want libcudart.so.13 | comm -23 - "$B/have.txt" | sed 's/.*/int &(void){return 0;}/' >"$B/cudart_rest.c"
  echo 'libcudart.so.13 { global: cuda*; __cuda*; fakecuda_*; local: *; };' >"$B/cudart.map"
  gcc -shared -fPIC -Wl,-soname,libcudart.so.13 -Wl,--version-script="$B/cudart.map" -o "$L/libcudart.so.13" \
    "$B/fakecudart.o" -x c "$B/cudart_rest.c" >>"$log" 2>&1
  # libcublasLt.so.13 / libcublas.so.13 / libcudnn.so.9: handles and descriptors are calloc'd
  # blocks, the rest no-ops; the entry points that launch work on a real device (`stubs PATTERN`)
  # count themselves in libcudart's fakecuda_library_call()
  stubs() { sed -E "s/^($1)\$/int &(void){fakecuda_library_call();return 0;}/; /fakecuda_library_call/!s/^.*\$/int &(void){return 0;}/"; }
  counted=(-L"$L" -l:libcudart.so.13)
  {
    echo '#include <stdlib.h>'; echo '#include <string.h>'; echo 'void fakecuda_library_call(void);'
    echo 'int cublasLtCreate(void **h){*h=calloc(1,256);return 0;}'
    echo 'int cublasLtMatmulAlgoGetHeuristic(void*h,void*o,void*a,void*b,void*c,void*d,void*p,int n,void*r,int*k){if(n>0)memset(r,0,64);*k=n>0;return 0;}'
    for f in cublasLtMatmulDescCreate cublasLtMatrixLayoutCreate cublasLtMatmulPreferenceCreate cublasLtMatrixTransformDescCreate; do
      echo "int $f(void **d){*d=calloc(1,1024);return 0;}"; done
    want libcublasLt.so.13 | grep -vxE 'cublasLt(Create|MatmulAlgoGetHeuristic|MatmulDescCreate|MatrixLayoutCreate|MatmulPreferenceCreate|MatrixTransformDescCreate)' \
      | stubs 'cublasLt(Matmul|MatrixTransform)'
  } >"$B/cublasLt.c"
  echo 'libcublasLt.so.13 { global: *; };' >"$B/cublasLt.map"
  gcc -shared -fPIC -Wl,-soname,libcublasLt.so.13 -Wl,--version-script="$B/cublasLt.map" -o "$L/libcublasLt.so.13" "$B/cublasLt.c" "${counted[@]}"
  {
    echo '#include <stdlib.h>'; echo 'void fakecuda_library_call(void);'
    echo 'int cublasCreate_v2(void **h){*h=calloc(1,256);return 0;} int cublasGetMathMode(void *h,int *m){*m=0;return 0;}'
    echo 'const char *cublasGetStatusName(int s){return "FAKE";} const char *cublasGetStatusString(int s){return "fake cublas";}'
    want libcublas.so.13 | grep -vxE 'cublas(Create_v2|GetMathMode|GetStatusName|GetStatusString)' \
      | stubs 'cublas([SDH](gemm|geam|copy|scal|getr)[A-Za-z_0-9]*|Gemm[A-Za-z]*)'
  } >"$B/cublas.c"
  echo 'libcublas.so.13 { global: *; };' >"$B/cublas.map"
  gcc -shared -fPIC -Wl,-soname,libcublas.so.13 -Wl,--version-script="$B/cublas.map" -o "$L/libcublas.so.13" "$B/cublas.c" "${counted[@]}"
  # libcurand.so.10 (needed, nothing imported), libcuda.so.1 (one driver entry point, "not supported")
  echo 'int fake_curand_unused(void){return 0;}' >"$B/curand.c"
  gcc -shared -fPIC -Wl,-soname,libcurand.so.10 -o "$L/libcurand.so.10" "$B/curand.c"
  {
    echo '#include <stdlib.h>'
    nm -D --undefined-only "$SO" | awk '{print $2}' | grep -E '^cu[A-Z]' | sed 's/@.*//' | sort -u | sed 's/.*/int &(void){return 801;}/'
  } >"$B/cuda.c"
  gcc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$L/libcuda.so.1" "$B/cuda.c"
  # libcudnn.so.9 (dlopen'd; every cudnn* name in the provider): handles/descriptors calloc'd, no-ops
  syms() { strings -n 6 "$SO" | grep -E "^$1[A-Z][A-Za-z_0-9]*$" | sort -u; }
  {
    echo '#include <stdlib.h>'; echo '#include <stddef.h>'; echo 'void fakecuda_library_call(void);'
    echo 'int cudnnCreate(void **h){*h=calloc(1,256);return 0;} size_t cudnnGetVersion(void){return 92801;}'
    echo 'const char *cudnnGetErrorString(int s){return "fake cudnn";} void cudnnGetLastErrorString(char *m,size_t n){if(n)m[0]=0;}'
    echo 'int cudnnGetStream(void *h,void **s){*s=0;return 0;} int cudnnDropoutGetStatesSize(void *h,size_t *s){*s=0;return 0;}'
    echo 'int cudnnGetReductionWorkspaceSize(void*h,void*r,void*a,void*c,size_t*s){*s=0;return 0;}'
    echo 'int cudnnGetReductionIndicesSize(void*h,void*r,void*a,void*c,size_t*s){*s=0;return 0;}'
    for f in $(syms cudnnCreate | grep 'Descriptor$'); do echo "int $f(void **d){*d=calloc(1,1024);return 0;}"; done
    syms cudnn | grep -vxE 'cudnn(Create|GetVersion|GetErrorString|GetLastErrorString|GetStream|DropoutGetStatesSize|GetReductionWorkspaceSize|GetReductionIndicesSize|Create[A-Za-z]*Descriptor)' \
      | stubs 'cudnn((Activation|BatchNormalization|Convolution|ConvolutionBiasActivation|LRNCrossChannel|Pooling|RNN|Softmax)Forward[A-Za-z]*|(Reduce|Add|Op|Scale|Set|Transform)Tensor|BackendExecute)'
  } >"$B/cudnn.c"
  gcc -shared -fPIC -Wl,-soname,libcudnn.so.9 -o "$L/libcudnn.so.9" "$B/cudnn.c" "${counted[@]}"
  cat >"$OUT/env.sh" <<EOS
# source before starting $OUT/venv/bin/python: the stub CUDA libraries stand in for the real ones
export LD_LIBRARY_PATH=$L
export ORT_ENABLE_CUDNN_FLASH_ATTENTION=0  # the stub cuDNN cannot build SDPA graphs (GQA would try it on sm_90)
EOS
  # smoke test: the provider library resolves every symbol against the stubs (ctypes: RTLD_NOW)
  ( source "$OUT/env.sh"; "$VPY" -c '
import ctypes, sys, onnxruntime as ort
assert "CUDAExecutionProvider" in ort.get_available_providers()
ctypes.CDLL(sys.argv[1])' "$SO" ) >>"$log" 2>&1 || { echo "the simulated device does not load (see $log)"; exit 1; }
  rm -f "$OUT"/ready-*; touch "$OUT/ready-$key"
fi

# the project in the sim venv: editable, no deps, then its base runtime deps (never onnxruntime),
# reinstalled when pyproject.toml or constraints.txt change
pstamp="$OUT/project-$(cat "$PROJ/pyproject.toml" "$PROJ/constraints.txt" | sha256sum | cut -c1-16)"
if [ ! -f "$pstamp" ]; then
  VPY="$OUT/venv/bin/python"
  mapfile -t deps < <("$VPY" - "$PROJ/pyproject.toml" <<'EOP'
import re, sys, tomllib
deps = tomllib.load(open(sys.argv[1], "rb"))["project"].get("dependencies", [])
print("\n".join(d for d in deps if not re.match(r"onnxruntime\b", d)))
EOP
)
  "$VPY" -m pip -q install -c "$PROJ/constraints.txt" "${deps[@]}" >>"$log" 2>&1 \
    || { echo "could not install the project's runtime deps in the sim venv (see $log)"; exit 1; }
  "$VPY" -m pip -q install --no-deps -e "$PROJ" >>"$log" 2>&1 \
    || { echo "could not install $PROJ in the sim venv (see $log)"; exit 1; }
  if "$VPY" -c 'import importlib.metadata as m; m.version("onnxruntime")' 2>/dev/null; then
    echo "installing the project pulled onnxruntime beside onnxruntime-gpu (see $log)"; exit 1
  fi
  rm -f "$OUT"/project-*; touch "$pstamp"
fi
echo "$OUT"

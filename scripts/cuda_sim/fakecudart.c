/* The simulated CUDA device: a stand-in libcudart.so.13 (built by build.sh as the library itself)
 * that pretends one sm_90 device exists, so that onnxruntime-gpu's CUDAExecutionProvider runs its
 * real host code (kernel registry, GetCapability, partitioning, Memcpy insertion, kernel
 * constructors, host-side shape checks at Run, CUDA-graph capture bookkeeping) on a machine with
 * no GPU and no driver. "Device" memory is host malloc; kernel launches are no-ops. NOTHING is
 * computed, and no NVIDIA wheel is needed. Capture follows CUDA's global-mode
 * rules where they are clear-cut: a cudaMalloc, a cudaDeviceSynchronize or a synchronize of the
 * capturing stream while it captures fails and invalidates the capture, as on a GPU
 * (cudaStreamCaptureModeRelaxed allows them). Other unsafe calls are let through (lenient).
 * Any other cuda* symbol the provider imports gets a generated `return cudaSuccess` stub. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cuda_runtime_api.h>

static int trace = -1;
#define T(name) do { if (trace < 0) trace = getenv("FAKECUDA_TRACE") != NULL; \
  if (trace) fprintf(stderr, "[fakecudart] %s\n", name); } while (0)

static void *fake_handle(void) { return calloc(1, 256); }

/* stream capture state (ORT captures one stream at a time) */
static int capturing = 0, capture_bad = 0, capture_relaxed = 0;
static cudaStream_t capture_stream = 0;
static long n_captures = 0, n_capture_errors = 0, n_graph_launches = 0, nlaunch = 0;
static cudaError_t during_capture(const char *what) {
  if (!capturing || capture_relaxed) return cudaSuccess;
  capture_bad = 1; n_capture_errors++;
  if (getenv("FAKECUDA_TRACE")) fprintf(stderr, "[fakecudart] %s while capturing: capture invalidated\n", what);
  return cudaErrorStreamCaptureUnsupported;
}
/* "device" memory: zero-filled host memory, 256-byte aligned (calloc leaves fresh mmap'd pages
 * untouched). No kernel ever writes it, so whatever the host reads back from the device (next
 * tokens, If conditions, data-dependent sizes) is zero or a copy of some input: deterministic. */
static void *dev_alloc(size_t n) {
  char *raw = calloc(1, n + 256 + sizeof(void *));
  if (!raw) return NULL;
  char *p = (char *)(((unsigned long)(raw + sizeof(void *)) + 255) & ~255UL);
  ((void **)p)[-1] = raw;
  return p;
}
static void dev_free(void *p) { if (p) free(((void **)p)[-1]); }
/* counters for the tests (ctypes): kernel launches, captures, capture errors, graph launches,
 * device->host copies, copies of kind cudaMemcpyDefault (direction unknown: copied as is),
 * host->device copies, the bytes of each direction, library calls, and the thread blocks the
 * launched kernels asked for (their grids: how much work, where a launch count says how many) */
static long n_d2h, n_default, n_h2d, b_d2h, b_h2d, n_library, n_blocks, n_d2d;
void fakecuda_stats(long *out) { out[0] = nlaunch; out[1] = n_captures; out[2] = n_capture_errors; out[3] = n_graph_launches; out[4] = n_d2h; out[5] = n_default; out[6] = n_h2d; out[7] = b_d2h; out[8] = b_h2d; out[9] = n_library; out[10] = n_blocks; out[11] = n_d2d; }
void fakecuda_reset(void) { nlaunch = n_captures = n_capture_errors = n_graph_launches = n_d2h = n_default = n_h2d = b_d2h = b_h2d = n_library = n_blocks = n_d2d = 0; }
static void launched(dim3 g) { nlaunch++; n_blocks += (long)g.x * g.y * g.z; }
/* called by the stub cuBLAS, cuBLASLt and cuDNN from every entry point that launches work on a real
 * device (a GEMM, a reduction, a softmax...): each is at least one kernel there */
void fakecuda_library_call(void) { n_library++; }

cudaError_t cudaGetDeviceCount(int *c) { T("cudaGetDeviceCount"); *c = 1; return cudaSuccess; }
cudaError_t cudaSetDevice(int d) { T("cudaSetDevice"); return d == 0 ? cudaSuccess : cudaErrorInvalidDevice; }
cudaError_t cudaGetDevice(int *d) { T("cudaGetDevice"); *d = 0; return cudaSuccess; }
cudaError_t cudaDeviceSynchronize(void) { T("cudaDeviceSynchronize"); return during_capture("cudaDeviceSynchronize"); }
cudaError_t cudaDriverGetVersion(int *v) { T("cudaDriverGetVersion"); *v = 13000; return cudaSuccess; }
cudaError_t cudaRuntimeGetVersion(int *v) { T("cudaRuntimeGetVersion"); *v = 13000; return cudaSuccess; }
cudaError_t cudaGetLastError(void) { return cudaSuccess; }
cudaError_t cudaPeekAtLastError(void) { return cudaSuccess; }

cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *p, int d) {
  T("cudaGetDeviceProperties");
  memset(p, 0, sizeof *p);
  strcpy(p->name, "FAKE sm_90 (no GPU)");
  p->major = 9; p->minor = 0;
  p->totalGlobalMem = 80ULL << 30;
  p->sharedMemPerBlock = 48 << 10; p->sharedMemPerBlockOptin = 227 << 10;
  p->sharedMemPerMultiprocessor = 228 << 10;
  p->regsPerBlock = 65536; p->regsPerMultiprocessor = 65536;
  p->warpSize = 32; p->maxThreadsPerBlock = 1024; p->maxThreadsPerMultiProcessor = 2048;
  p->maxThreadsDim[0] = 1024; p->maxThreadsDim[1] = 1024; p->maxThreadsDim[2] = 64;
  p->maxGridSize[0] = 0x7fffffff; p->maxGridSize[1] = 65535; p->maxGridSize[2] = 65535;
  p->multiProcessorCount = 132; p->l2CacheSize = 50 << 20; p->totalConstMem = 65536;
  p->memoryBusWidth = 5120; p->concurrentKernels = 1; p->unifiedAddressing = 1;
  p->managedMemory = 1; p->memoryPoolsSupported = 1; p->maxBlocksPerMultiProcessor = 32;
  p->asyncEngineCount = 2; p->canMapHostMemory = 1; p->integrated = 0;
  return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int *v, enum cudaDeviceAttr a, int d) {
  T("cudaDeviceGetAttribute");
  switch (a) {
    case cudaDevAttrComputeCapabilityMajor: *v = 9; break;
    case cudaDevAttrComputeCapabilityMinor: *v = 0; break;
    case cudaDevAttrMultiProcessorCount: *v = 132; break;
    case cudaDevAttrMaxSharedMemoryPerMultiprocessor: *v = 228 << 10; break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *v = 227 << 10; break;
    case cudaDevAttrMaxSharedMemoryPerBlock: *v = 48 << 10; break;
    case cudaDevAttrMaxThreadsPerBlock: *v = 1024; break;
    case cudaDevAttrMaxThreadsPerMultiProcessor: *v = 2048; break;
    case cudaDevAttrWarpSize: *v = 32; break;
    case cudaDevAttrL2CacheSize: *v = 50 << 20; break;
    case cudaDevAttrMemoryPoolsSupported: *v = 1; break;
    case cudaDevAttrMaxBlocksPerMultiprocessor: *v = 32; break;
    default: *v = 1; break;
  }
  return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t *f, size_t *t) { T("cudaMemGetInfo"); *f = 78ULL << 30; *t = 80ULL << 30; return cudaSuccess; }

cudaError_t cudaStreamCreate(cudaStream_t *s) { T("cudaStreamCreate"); *s = fake_handle(); return cudaSuccess; }
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned f) { T("cudaStreamCreateWithFlags"); *s = fake_handle(); return cudaSuccess; }
cudaError_t cudaStreamDestroy(cudaStream_t s) { return cudaSuccess; }
cudaError_t cudaStreamSynchronize(cudaStream_t s) { return capturing && (s == capture_stream || s == 0) ? during_capture("cudaStreamSynchronize") : cudaSuccess; }
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned f) { return cudaSuccess; }
cudaError_t cudaStreamIsCapturing(cudaStream_t s, enum cudaStreamCaptureStatus *st) {
  *st = !capturing ? cudaStreamCaptureStatusNone : capture_bad ? cudaStreamCaptureStatusInvalidated : cudaStreamCaptureStatusActive; return cudaSuccess; }
cudaError_t cudaEventCreate(cudaEvent_t *e) { *e = fake_handle(); return cudaSuccess; }
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned f) { *e = fake_handle(); return cudaSuccess; }
cudaError_t cudaEventDestroy(cudaEvent_t e) { return cudaSuccess; }
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) { return cudaSuccess; }
cudaError_t cudaEventRecordWithFlags(cudaEvent_t e, cudaStream_t s, unsigned f) { return cudaSuccess; }
cudaError_t cudaEventSynchronize(cudaEvent_t e) { return cudaSuccess; }

cudaError_t cudaMalloc(void **p, size_t n) { T("cudaMalloc"); if (capturing && !capture_relaxed) return during_capture("cudaMalloc"); *p = dev_alloc(n); return *p ? cudaSuccess : cudaErrorMemoryAllocation; }
cudaError_t cudaFree(void *p) { dev_free(p); return cudaSuccess; }
cudaError_t cudaMallocHost(void **p, size_t n) { *p = dev_alloc(n); return *p ? cudaSuccess : cudaErrorMemoryAllocation; }
cudaError_t cudaHostAlloc(void **p, size_t n, unsigned f) { return cudaMallocHost(p, n); }
cudaError_t cudaFreeHost(void *p) { dev_free(p); return cudaSuccess; }
/* Copies. Device->host copies deliver ZEROS: no kernel ran, so the device holds nothing meaningful
 * (an arena chunk may still hold bytes of an earlier input, e.g. -1 bias ids, which would make an
 * invalid token id). Everything the host reads back -- next tokens, If conditions, TopK's k, NonZero
 * counts, data-dependent sizes -- is therefore 0: deterministic, and a valid token id. */
static void copy(void *d, const void *s, size_t n, enum cudaMemcpyKind k) {
  if (!n) return;
  if (k == cudaMemcpyDeviceToHost) { n_d2h++; b_d2h += n; memset(d, 0, n); return; }
  if (k == cudaMemcpyHostToDevice) { n_h2d++; b_h2d += n; }
  if (k == cudaMemcpyDeviceToDevice) n_d2d++;
  if (k == cudaMemcpyDefault) n_default++;
  memcpy(d, s, n);
}
cudaError_t cudaMemcpy(void *d, const void *s, size_t n, enum cudaMemcpyKind k) { T("cudaMemcpy"); copy(d, s, n, k); return cudaSuccess; }
cudaError_t cudaMemcpyAsync(void *d, const void *s, size_t n, enum cudaMemcpyKind k, cudaStream_t st) { T("cudaMemcpyAsync"); copy(d, s, n, k); return cudaSuccess; }
cudaError_t cudaMemset(void *d, int v, size_t n) { memset(d, v, n); return cudaSuccess; }
cudaError_t cudaMemsetAsync(void *d, int v, size_t n, cudaStream_t s) { memset(d, v, n); return cudaSuccess; }
cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *a, const void *p) {
  memset(a, 0, sizeof *a); a->type = cudaMemoryTypeDevice; a->device = 0;
  a->devicePointer = (void *)p; a->hostPointer = (void *)p; return cudaSuccess;
}

/* kernel launches: no-ops (nothing is computed) */
cudaError_t cudaLaunchKernel(const void *f, dim3 g, dim3 b, void **a, size_t sm, cudaStream_t s) { launched(g); return cudaSuccess; }
cudaError_t cudaLaunchKernelExC(const cudaLaunchConfig_t *c, const void *f, void **a) { launched(c->gridDim); return cudaSuccess; }
cudaError_t cudaLaunchCooperativeKernel(const void *f, dim3 g, dim3 b, void **a, size_t sm, cudaStream_t s) { launched(g); return cudaSuccess; }
cudaError_t cudaLaunchHostFunc(cudaStream_t s, cudaHostFn_t fn, void *u) { fn(u); return cudaSuccess; }
cudaError_t __cudaGetKernel(cudaKernel_t *k, const void *f) { *k = (cudaKernel_t)f; return cudaSuccess; }
cudaError_t __cudaLaunchKernel(cudaKernel_t k, dim3 g, dim3 b, void **a, size_t sm, cudaStream_t s) { launched(g); return cudaSuccess; }
/* a <<<grid, block, shared, stream>>> launch pushes its configuration, and the kernel's stub pops
 * it to pass to cudaLaunchKernel: kept here so that the launch sees the real grid */
static dim3 pushed_g = {1, 1, 1}, pushed_b = {1, 1, 1};
static size_t pushed_sm; static void *pushed_s;
unsigned __cudaPushCallConfiguration(dim3 g, dim3 b, size_t sm, void *s) { pushed_g = g; pushed_b = b; pushed_sm = sm; pushed_s = s; return 0; }
cudaError_t __cudaPopCallConfiguration(dim3 *g, dim3 *b, size_t *sm, void *s) {
  *g = pushed_g; *b = pushed_b; *sm = pushed_sm; *(void **)s = pushed_s; return cudaSuccess;
}
cudaError_t cudaFuncGetAttributes(struct cudaFuncAttributes *a, const void *f) { memset(a, 0, sizeof *a); a->maxThreadsPerBlock = 1024; a->binaryVersion = 90; a->ptxVersion = 90; return cudaSuccess; }
cudaError_t cudaFuncSetAttribute(const void *f, enum cudaFuncAttribute a, int v) { return cudaSuccess; }
cudaError_t cudaKernelSetAttributeForDevice(cudaKernel_t k, enum cudaFuncAttribute a, int v, int d) { return cudaSuccess; }
cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(int *n, const void *f, int bs, size_t sm, unsigned fl) { *n = 1; return cudaSuccess; }
cudaError_t cudaGetDriverEntryPointByVersion(const char *sym, void **fp, unsigned v, unsigned long long fl, enum cudaDriverEntryPointQueryResult *st) {
  T("cudaGetDriverEntryPointByVersion"); *fp = NULL; if (st) *st = cudaDriverEntryPointSymbolNotFound; return cudaErrorNotSupported;
}
cudaError_t cudaLibraryLoadData(cudaLibrary_t *l, const void *code, enum cudaJitOption *jo, void **jv, unsigned nj,
                                enum cudaLibraryOption *lo, void **lv, unsigned nl) { *l = fake_handle(); return cudaSuccess; }
cudaError_t cudaLibraryGetKernel(cudaKernel_t *k, cudaLibrary_t l, const char *n) { *k = fake_handle(); return cudaSuccess; }
cudaError_t cudaLibraryUnload(cudaLibrary_t l) { return cudaSuccess; }
cudaError_t cudaMemPoolCreate(cudaMemPool_t *p, const struct cudaMemPoolProps *pp) { *p = fake_handle(); return cudaSuccess; }
cudaError_t cudaMemPoolDestroy(cudaMemPool_t p) { return cudaSuccess; }
cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t p, enum cudaMemPoolAttr a, void *v) { return cudaSuccess; }
cudaError_t cudaMemPoolGetAttribute(cudaMemPool_t p, enum cudaMemPoolAttr a, void *v) { memset(v, 0, 8); return cudaSuccess; }
cudaError_t cudaMemPoolTrimTo(cudaMemPool_t p, size_t n) { return cudaSuccess; }
cudaError_t cudaMallocFromPoolAsync(void **p, size_t n, cudaMemPool_t pool, cudaStream_t s) { *p = dev_alloc(n); return *p ? cudaSuccess : cudaErrorMemoryAllocation; }
cudaError_t cudaFreeAsync(void *p, cudaStream_t s) { dev_free(p); return cudaSuccess; }


/* what the LD_PRELOAD version left to the real libcudart */
void **__cudaRegisterFatBinary(void *fatCubin) { static void *h[8]; return h; }
void __cudaRegisterFatBinaryEnd(void **h) {}
void __cudaUnregisterFatBinary(void **h) {}
void __cudaRegisterFunction(void **h, const char *hf, char *df, const char *dn, int tl, void *tid, void *bid, void *bd, void *gd, int *ws) {}
void __cudaRegisterVar(void **h, char *hv, char *da, const char *dn, int ext, size_t size, int constant, int global) {}
const char *cudaGetErrorName(cudaError_t e) { static char b[32]; snprintf(b, sizeof b, "cudaError%d", (int)e); return b; }
const char *cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorStreamCaptureUnsupported: return "operation not permitted when stream is capturing (fake device)";
    case cudaErrorStreamCaptureInvalidated: return "operation failed due to a previous error during capture (fake device)";
    default: return "fake CUDA error";
  }
}
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b) { *ms = 0.f; return cudaSuccess; }
cudaError_t cudaMemcpy2DAsync(void *d, size_t dp, const void *s, size_t sp, size_t w, size_t h, enum cudaMemcpyKind k, cudaStream_t st) {
  for (size_t r = 0; r < h; r++) copy((char *)d + r * dp, (const char *)s + r * sp, w, k);
  return cudaSuccess;
}
cudaError_t cudaMemcpyFromSymbol(void *d, const void *sym, size_t n, size_t off, enum cudaMemcpyKind k) {
  if (n) memset(d, 0, n); return cudaSuccess;  /* device symbol -> host: zeros, as above */
}
cudaError_t cudaStreamBeginCapture(cudaStream_t s, enum cudaStreamCaptureMode m) {
  T("cudaStreamBeginCapture"); if (capturing) return cudaErrorIllegalState;
  capturing = 1; capture_bad = 0; capture_stream = s; capture_relaxed = m == cudaStreamCaptureModeRelaxed; return cudaSuccess;
}
cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *g) {
  T("cudaStreamEndCapture"); if (!capturing) return cudaErrorIllegalState;
  capturing = 0; if (capture_bad) { *g = NULL; return cudaErrorStreamCaptureInvalidated; }
  n_captures++; *g = (cudaGraph_t)fake_handle(); return cudaSuccess;
}
cudaError_t cudaGraphInstantiate(cudaGraphExec_t *e, cudaGraph_t g, unsigned long long f) { if (!g) return cudaErrorInvalidValue; *e = (cudaGraphExec_t)fake_handle(); return cudaSuccess; }
cudaError_t cudaGraphLaunch(cudaGraphExec_t e, cudaStream_t s) { if (!e) return cudaErrorInvalidValue; n_graph_launches++; return cudaSuccess; }
cudaError_t cudaGraphDestroy(cudaGraph_t g) { return cudaSuccess; }
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t e) { return cudaSuccess; }

__attribute__((destructor)) static void fin(void) { if (getenv("FAKECUDA_TRACE")) fprintf(stderr, "[fakecudart] %ld no-op kernel launches, %ld graphs captured, %ld graph launches, %ld calls refused during capture\n", nlaunch, n_captures, n_graph_launches, n_capture_errors); }

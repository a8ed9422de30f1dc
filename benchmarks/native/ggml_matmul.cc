// GgmlMatMul (domain onnxsample.ggml): Y[..., N] = X[..., K] @ W.T, where W is a GGUF tensor's
// rows as the file stores them (uint8 [N, row bytes], any ggml type) and the product is ggml's
// own: X's rows quantised by the type's `from_float` to its `vec_dot_type`, then one `vec_dot`
// per output, as llama.cpp's CPU backend computes a matrix-vector product of unrepacked weights.
// Outputs are split into chunks of 64 across ONNX Runtime's intra-op threads.
//
// For benchmarks/gguf_kernels.py only: llama.cpp's kernels inside an ONNX Runtime session, timed
// against the MatMulNBits form of the same weights. Built against the llama.cpp build's ggml.
#define ORT_API_MANUAL_INIT
#include <onnxruntime_cxx_api.h>

#include <ggml-cpu.h>
#include <ggml.h>

#include <cstdint>
#include <vector>

namespace {

constexpr int64_t kChunk = 64;

struct Product {
  const ggml_type_traits_cpu* traits;
  const uint8_t* w;
  size_t w_row;
  const uint8_t* x;
  size_t x_row;
  float* y;
  int64_t k, n, m;
};

void chunk(void* data, size_t index) {
  const Product& p = *static_cast<const Product*>(data);
  const int64_t first = static_cast<int64_t>(index) * kChunk;
  const int64_t last = first + kChunk < p.n ? first + kChunk : p.n;
  for (int64_t row = 0; row < p.m; ++row) {
    float* y = p.y + row * p.n;
    const uint8_t* x = p.x + row * p.x_row;
    for (int64_t j = first; j < last; ++j) {
      p.traits->vec_dot(static_cast<int>(p.k), y + j, 0, p.w + j * p.w_row, 0, x, 0, 1);
    }
  }
}

struct Kernel {
  ggml_type type;

  Kernel(const OrtApi&, const OrtKernelInfo* info)
      : type(static_cast<ggml_type>(Ort::ConstKernelInfo(info).GetAttribute<int64_t>("ggml_type"))) {}

  void Compute(OrtKernelContext* raw) {
    Ort::KernelContext context(raw);
    auto x = context.GetInput(0);
    auto w = context.GetInput(1);
    std::vector<int64_t> shape = x.GetTensorTypeAndShapeInfo().GetShape();
    const int64_t k = shape.back();
    const int64_t n = w.GetTensorTypeAndShapeInfo().GetShape()[0];
    int64_t m = 1;
    for (size_t i = 0; i + 1 < shape.size(); ++i) m *= shape[i];
    shape.back() = n;
    auto y = context.GetOutput(0, shape);

    const ggml_type_traits_cpu* traits = ggml_get_type_traits_cpu(type);
    const float* xf = x.GetTensorData<float>();
    std::vector<uint8_t> quantised;
    Product p{traits, w.GetTensorData<uint8_t>(), ggml_row_size(type, k),
              reinterpret_cast<const uint8_t*>(xf), k * sizeof(float),
              y.GetTensorMutableData<float>(), k, n, m};
    if (traits->vec_dot_type != GGML_TYPE_F32) {
      p.x_row = ggml_row_size(traits->vec_dot_type, k);
      quantised.resize(p.x_row * m);
      auto from_float = ggml_get_type_traits_cpu(traits->vec_dot_type)->from_float;
      for (int64_t row = 0; row < m; ++row) {
        from_float(xf + row * k, quantised.data() + row * p.x_row, k);
      }
      p.x = quantised.data();
    }
    context.ParallelFor(chunk, static_cast<size_t>((n + kChunk - 1) / kChunk), 0, &p);
  }
};

struct GgmlMatMul : Ort::CustomOpBase<GgmlMatMul, Kernel> {
  void* CreateKernel(const OrtApi& api, const OrtKernelInfo* info) const { return new Kernel(api, info); }
  const char* GetName() const { return "GgmlMatMul"; }
  size_t GetInputTypeCount() const { return 2; }
  ONNXTensorElementDataType GetInputType(size_t i) const {
    return i == 0 ? ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT : ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8;
  }
  size_t GetOutputTypeCount() const { return 1; }
  ONNXTensorElementDataType GetOutputType(size_t) const { return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT; }
};

GgmlMatMul op;

}  // namespace

extern "C" OrtStatus* ORT_API_CALL RegisterCustomOps(OrtSessionOptions* options, const OrtApiBase* base) {
  Ort::InitApi(base->GetApi(ORT_API_VERSION));
  ggml_cpu_init();
  static Ort::CustomOpDomain domain{"onnxsample.ggml"};
  domain.Add(&op);
  Ort::UnownedSessionOptions(options).Add(domain);
  return nullptr;
}

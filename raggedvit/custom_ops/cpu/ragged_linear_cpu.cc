// CPU kernel: X and W as float (converted once per call for float16), then one task per block of live rows; each
// task walks W's rows once per group of kRowGroup X rows, so a W row is read from L1 by every row of the group.
#include "ragged_linear_cpu.h"
#include "float_convert.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace raggedvit {

namespace {

constexpr int64_t kRowsPerTask = 32;
constexpr int64_t kRowGroup = 4;

// sum a[k] * b[k] over 8 lanes (vectorised; cloned for AVX2+FMA CPUs), then the lanes in order.
__attribute__((target_clones("arch=haswell", "default"))) float Dot(const float* __restrict a,
                                                                    const float* __restrict b, int64_t n) {
  float lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t k = 0;
  for (; k + 8 <= n; k += 8) {
    for (int j = 0; j < 8; ++j) lanes[j] += a[k + j] * b[k + j];
  }
  float s = 0.0f;
  for (; k < n; ++k) s += a[k] * b[k];
  for (int j = 0; j < 8; ++j) s += lanes[j];
  return s;
}

template <typename T>
struct Job {
  const float* x;  // [T, K] float
  const float* w;  // [N, K] float
  const T* bias;   // [N] or nullptr
  const T* residual;  // [T, N] or nullptr
  T* y;
  int64_t live, N, K;
  bool gelu;
};

template <typename T>
void RunTask(void* data, size_t index) {
  const Job<T>& job = *static_cast<const Job<T>*>(data);
  const int64_t begin = static_cast<int64_t>(index) * kRowsPerTask;
  const int64_t end = std::min(job.live, begin + kRowsPerTask);
  const int64_t N = job.N, K = job.K;
  for (int64_t r0 = begin; r0 < end; r0 += kRowGroup) {
    const int64_t rows = std::min(kRowGroup, end - r0);
    for (int64_t n = 0; n < N; ++n) {
      const float* wrow = job.w + n * K;
      const float b = job.bias != nullptr ? ToFloat(job.bias[n]) : 0.0f;
      for (int64_t i = 0; i < rows; ++i) {
        const int64_t r = r0 + i;
        float v = Dot(job.x + r * K, wrow, K) + b;
        if (job.gelu) v = 0.5f * v * (1.0f + std::erf(v * 0.70710678118654752f));
        if (job.residual != nullptr) v += ToFloat(job.residual[r * N + n]);
        job.y[r * N + n] = FromFloat<T>(v);
      }
    }
  }
}

// data as float: the tensor itself for float, else a converted copy in *buf.
template <typename T>
const float* AsFloat(const T* data, int64_t count, std::vector<float>* buf) {
  if constexpr (std::is_same_v<T, float>) {
    return data;
  } else {
    buf->resize(static_cast<size_t>(count));
    for (int64_t i = 0; i < count; ++i) (*buf)[static_cast<size_t>(i)] = ToFloat(data[i]);
    return buf->data();
  }
}

template <typename T>
OrtStatusPtr Compute(Ort::KernelContext& ctx, const LinearAttrs& attrs, const LinearValues& v, const LinearDims& d) {
  int64_t live = d.T;
  if (v.info.has_cu) {
    live = v.info.cu_type == ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32 ? LiveRows(v.cu.GetTensorData<int32_t>(), d)
                                                                  : LiveRows(v.cu.GetTensorData<int64_t>(), d);
  }
  auto y_value = ctx.GetOutput(0, {d.T, d.N});
  T* y = y_value.GetTensorMutableData<T>();
  // T*N, live*K and N*K fit int64 bytes (CheckLinearInputs)
  std::fill(y + live * d.N, y + d.T * d.N, FromFloat<T>(0.0f));  // dead rows
  if (live == 0 || d.N == 0) return nullptr;
  std::vector<float> x_buf, w_buf;
  Job<T> job;
  job.x = AsFloat(v.x.GetTensorData<T>(), live * d.K, &x_buf);  // only the live rows are read
  job.w = AsFloat(v.w.GetTensorData<T>(), d.N * d.K, &w_buf);
  job.bias = v.info.has_bias ? v.bias.GetTensorData<T>() : nullptr;
  job.residual = v.info.has_residual ? v.residual.GetTensorData<T>() : nullptr;
  job.y = y;
  job.live = live;
  job.N = d.N;
  job.K = d.K;
  job.gelu = attrs.activation == 1;
  const int64_t tasks = (live + kRowsPerTask - 1) / kRowsPerTask;
  ctx.ParallelFor(&RunTask<T>, static_cast<size_t>(tasks), 0, &job);
  return nullptr;
}

}  // namespace

RaggedLinearCpuKernel::RaggedLinearCpuKernel(const LinearAttrs& attrs, const OrtKernelInfo*) : attrs_(attrs) {}

OrtStatusPtr RaggedLinearCpuKernel::ComputeV2(OrtKernelContext* context) {
  return GuardStatus(
      [&]() -> OrtStatusPtr {
        Ort::KernelContext ctx(context);
        const LinearValues v = ReadLinearInputs(ctx);
        LinearDims d;
        std::string err = CheckLinearInputs(v.info, &d);
        if (!err.empty()) return MakeLinearStatus(ORT_INVALID_ARGUMENT, err);
        switch (v.info.x_type) {
          case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT: return Compute<float>(ctx, attrs_, v, d);
          case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16: return Compute<Ort::Float16_t>(ctx, attrs_, v, d);
          default:
            return MakeLinearStatus(ORT_INVALID_ARGUMENT, "input 'X' (shape " + ShapeString(v.info.x) +
                                                              ") has element type " +
                                                              ElementTypeName(v.info.x_type) +
                                                              "; the CPU EP supports float and float16");
        }
      },
      kLinearOpName);
}

}  // namespace raggedvit

// CPU kernel: GELU(x + b) = s * erfc(-s / sqrt 2) / 2 in float (erfc keeps the negative tail's relative accuracy),
// one task per block of rows.
#include "bias_gelu_cpu.h"
#include "float_convert.h"

#include <algorithm>
#include <cmath>

namespace raggedvit {

namespace {

constexpr int64_t kElementsPerTask = 1 << 15;

template <typename T>
struct Job {
  const T* x;
  const T* bias;  // [N] or nullptr
  T* y;
  int64_t M, N, rows_per_task;
};

template <typename T>
void RunTask(void* data, size_t index) {
  const Job<T>& job = *static_cast<const Job<T>*>(data);
  const int64_t begin = static_cast<int64_t>(index) * job.rows_per_task;
  const int64_t end = std::min(job.M, begin + job.rows_per_task);
  for (int64_t r = begin; r < end; ++r) {
    const T* x = job.x + r * job.N;
    T* y = job.y + r * job.N;
    for (int64_t n = 0; n < job.N; ++n) {
      const float s = ToFloat(x[n]) + (job.bias != nullptr ? ToFloat(job.bias[n]) : 0.0f);
      y[n] = FromFloat<T>(0.5f * s * std::erfc(-s * 0.70710678118654752f));
    }
  }
}

template <typename T>
OrtStatusPtr Compute(Ort::KernelContext& ctx, const GeluValues& v, const GeluDims& d) {
  auto y_value = ctx.GetOutput(0, v.x_shape);
  if (d.M == 0 || d.N == 0) return nullptr;
  Job<T> job;
  job.x = v.x.GetTensorData<T>();
  job.bias = v.has_bias ? v.bias.GetTensorData<T>() : nullptr;
  job.y = y_value.GetTensorMutableData<T>();
  job.M = d.M;
  job.N = d.N;
  job.rows_per_task = std::max<int64_t>(1, kElementsPerTask / d.N);
  const int64_t tasks = (d.M + job.rows_per_task - 1) / job.rows_per_task;  // M*N fits int64 (CheckGeluInputs)
  ctx.ParallelFor(&RunTask<T>, static_cast<size_t>(tasks), 0, &job);
  return nullptr;
}

}  // namespace

BiasGeluCpuKernel::BiasGeluCpuKernel(const OrtKernelInfo*) {}

OrtStatusPtr BiasGeluCpuKernel::ComputeV2(OrtKernelContext* context) {
  return GuardStatus(
      [&]() -> OrtStatusPtr {
        Ort::KernelContext ctx(context);
        const GeluValues v = ReadGeluInputs(ctx);
        GeluDims d;
        std::string err = CheckGeluInputs(v, &d);
        if (!err.empty()) return MakeGeluStatus(ORT_INVALID_ARGUMENT, err);
        switch (v.x_type) {
          case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT: return Compute<float>(ctx, v, d);
          case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16: return Compute<Ort::Float16_t>(ctx, v, d);
          default:
            return MakeGeluStatus(ORT_INVALID_ARGUMENT, "input 'X' (shape " + ShapeString(v.x_shape) +
                                                            ") has element type " + ElementTypeName(v.x_type) +
                                                            "; the CPU EP supports float and float16");
        }
      },
      kGeluOpName);
}

}  // namespace raggedvit

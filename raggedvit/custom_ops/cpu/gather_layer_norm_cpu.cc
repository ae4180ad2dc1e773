// CPU kernel: per live output row, the float sum X[i] + Skip[i] + Bias, its mean and biased variance (accumulated
// in double), the normalised row, each output rounded once; zeros in the dead rows past clamp(CuSeqlens[B], 0, R)
// (cheap and deterministic; the CUDA kernel leaves them unwritten); one task per block of rows.
#include "gather_layer_norm_cpu.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "float_convert.h"

namespace raggedvit {

namespace {

constexpr int64_t kElementsPerTask = 1 << 15;

template <typename T>
struct Job {
  const T *x, *skip, *bias, *gamma, *beta;  // skip / bias may be nullptr
  const int64_t* index;
  T *normed, *sum;
  int64_t T_rows, R, D, rows_per_task;
  int64_t live;  // rows r >= live are dead: zero
  float eps;
};

template <typename T>
void RunTask(void* data, size_t task) {
  const Job<T>& job = *static_cast<const Job<T>*>(data);
  const int64_t begin = static_cast<int64_t>(task) * job.rows_per_task;
  const int64_t end = std::min(job.R, begin + job.rows_per_task);
  const int64_t D = job.D;
  std::vector<float> s(static_cast<size_t>(D));
  for (int64_t r = begin; r < end; ++r) {
    int64_t i = job.index[r];
    if (i < 0) i += job.T_rows;
    T* n_out = job.normed + r * D;
    T* s_out = job.sum + r * D;
    if (r >= job.live || i < 0 || i >= job.T_rows) {  // dead, or outside [-T, T): zero rows
      std::fill(n_out, n_out + D, FromFloat<T>(0.0f));
      std::fill(s_out, s_out + D, FromFloat<T>(0.0f));
      continue;
    }
    const T* x = job.x + i * D;
    const T* skip = job.skip != nullptr ? job.skip + i * D : nullptr;
    double total = 0.0;
    for (int64_t d = 0; d < D; ++d) {
      float v = ToFloat(x[d]);
      if (skip != nullptr) v += ToFloat(skip[d]);
      if (job.bias != nullptr) v += ToFloat(job.bias[d]);
      s[d] = v;
      total += v;
    }
    const double mean = total / static_cast<double>(D);
    double squares = 0.0;
    for (int64_t d = 0; d < D; ++d) {
      const double c = s[d] - mean;
      squares += c * c;
    }
    const float rstd = static_cast<float>(1.0 / std::sqrt(squares / static_cast<double>(D) + job.eps));
    const float m = static_cast<float>(mean);
    for (int64_t d = 0; d < D; ++d) {
      n_out[d] = FromFloat<T>((s[d] - m) * rstd * ToFloat(job.gamma[d]) + ToFloat(job.beta[d]));
      s_out[d] = FromFloat<T>(s[d]);
    }
  }
}

template <typename T>
OrtStatusPtr Compute(Ort::KernelContext& ctx, const NormValues& v, const NormDims& d, float eps) {
  const std::vector<int64_t> out_shape{d.R, d.D};
  auto normed = ctx.GetOutput(0, out_shape);
  auto sum = ctx.GetOutput(1, out_shape);
  if (d.R == 0 || d.D == 0) return nullptr;
  Job<T> job;
  job.x = v.x.GetTensorData<T>();
  job.skip = v.has_skip ? v.skip.GetTensorData<T>() : nullptr;
  job.bias = v.has_bias ? v.bias.GetTensorData<T>() : nullptr;
  job.gamma = v.gamma.GetTensorData<T>();
  job.beta = v.beta.GetTensorData<T>();
  job.index = v.index.GetTensorData<int64_t>();
  job.normed = normed.GetTensorMutableData<T>();
  job.sum = sum.GetTensorMutableData<T>();
  job.T_rows = d.T;
  job.R = d.R;
  job.D = d.D;
  job.eps = eps;
  job.live = d.R;
  if (v.has_cu) {
    job.live = v.cu_type == ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64 ? LiveNormRows(v.cu.GetTensorData<int64_t>(), d)
                                                                 : LiveNormRows(v.cu.GetTensorData<int32_t>(), d);
  }
  job.rows_per_task = std::max<int64_t>(1, kElementsPerTask / d.D);
  const int64_t tasks = (d.R + job.rows_per_task - 1) / job.rows_per_task;  // R*D fits int64 (CheckNormInputs)
  ctx.ParallelFor(&RunTask<T>, static_cast<size_t>(tasks), 0, &job);
  return nullptr;
}

}  // namespace

GatherLayerNormCpuKernel::GatherLayerNormCpuKernel(const OrtKernelInfo* info) : epsilon_(ReadNormEpsilon(info)) {}

OrtStatusPtr GatherLayerNormCpuKernel::ComputeV2(OrtKernelContext* context) {
  return GuardStatus(
      [&]() -> OrtStatusPtr {
        Ort::KernelContext ctx(context);
        const NormValues v = ReadNormInputs(ctx);
        NormDims d;
        std::string err = CheckNormInputs(v, &d);
        if (!err.empty()) return MakeNormStatus(ORT_INVALID_ARGUMENT, err);
        switch (v.x_type) {
          case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT: return Compute<float>(ctx, v, d, epsilon_);
          case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16: return Compute<Ort::Float16_t>(ctx, v, d, epsilon_);
          default:
            return MakeNormStatus(ORT_INVALID_ARGUMENT, "input 'X' (shape " + ShapeString(v.x_shape) +
                                                            ") has element type " + ElementTypeName(v.x_type) +
                                                            "; the CPU EP supports float and float16");
        }
      },
      kNormOpName);
}

}  // namespace raggedvit

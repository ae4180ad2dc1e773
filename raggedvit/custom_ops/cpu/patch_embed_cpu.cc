// CPU kernel: the weight converted to float once per call; per output row, the patch's pixels rounded to float16,
// their products with the weight summed in float (k ascending), plus the position row, rounded once to float16;
// prefix rows are Prefix + Pos. One task per block of rows.
#include "patch_embed_cpu.h"

#include <algorithm>
#include <vector>

#include "float_convert.h"

namespace raggedvit {

namespace {

constexpr int64_t kMacsPerTask = 1 << 21;

template <typename T>
struct Job {
  const T* images;
  const float *weight, *prefix, *pos;  // weight: [K, N] converted to float
  Ort::Float16_t* out;
  EmbedDims d;
  int64_t rows_per_task;
};

template <typename T>
void RunTask(void* data, size_t task) {
  const Job<T>& job = *static_cast<const Job<T>*>(data);
  const EmbedDims& d = job.d;
  const int64_t S = d.P + d.L, p = d.patch;
  const int64_t begin = static_cast<int64_t>(task) * job.rows_per_task;
  const int64_t end = std::min(d.B * S, begin + job.rows_per_task);
  std::vector<float> a(static_cast<size_t>(d.K)), acc(static_cast<size_t>(d.N));
  for (int64_t r = begin; r < end; ++r) {
    const int64_t b = r / S, j = r % S;
    Ort::Float16_t* out = job.out + r * d.N;
    const float* pos = job.pos + j * d.N;
    if (j < d.P) {
      const float* prefix = job.prefix + j * d.N;
      for (int64_t n = 0; n < d.N; ++n) out[n] = Ort::Float16_t(prefix[n] + pos[n]);
      continue;
    }
    const int64_t l = j - d.P, py = l / d.gw, px = l % d.gw;
    for (int64_t c = 0, k = 0; c < d.C; ++c) {
      for (int64_t ky = 0; ky < p; ++ky) {
        const T* src = job.images + ((b * d.C + c) * d.H + py * p + ky) * d.W + px * p;
        for (int64_t kx = 0; kx < p; ++kx, ++k) a[k] = Ort::Float16_t(ToFloat(src[kx])).ToFloat();
      }
    }
    std::fill(acc.begin(), acc.end(), 0.0f);
    for (int64_t k = 0; k < d.K; ++k) {
      const float ak = a[k];
      const float* w = job.weight + k * d.N;
      for (int64_t n = 0; n < d.N; ++n) acc[n] += ak * w[n];
    }
    for (int64_t n = 0; n < d.N; ++n) out[n] = Ort::Float16_t(acc[n] + pos[n]);
  }
}

template <typename T>
OrtStatusPtr Compute(Ort::KernelContext& ctx, const EmbedValues& v, const EmbedDims& d) {
  const int64_t S = d.P + d.L;
  auto out = ctx.GetOutput(0, std::vector<int64_t>{d.B, S, d.N});
  if (d.B == 0 || S == 0 || d.N == 0) return nullptr;
  const Ort::Float16_t* w16 = v.weight.GetTensorData<Ort::Float16_t>();
  std::vector<float> weight(static_cast<size_t>(d.K * d.N));  // K*N*4 bytes fit int64 (CheckEmbedInputs)
  for (size_t i = 0; i < weight.size(); ++i) weight[i] = w16[i].ToFloat();
  Job<T> job;
  job.images = v.images.GetTensorData<T>();
  job.weight = weight.data();
  job.prefix = v.prefix.GetTensorData<float>();
  job.pos = v.pos.GetTensorData<float>();
  job.out = out.GetTensorMutableData<Ort::Float16_t>();
  job.d = d;
  job.rows_per_task = std::max<int64_t>(1, kMacsPerTask / std::max<int64_t>(1, d.K * d.N));
  const int64_t tasks = (d.B * S + job.rows_per_task - 1) / job.rows_per_task;  // B*S*N fits int64
  ctx.ParallelFor(&RunTask<T>, static_cast<size_t>(tasks), 0, &job);
  return nullptr;
}

}  // namespace

PatchEmbedCpuKernel::PatchEmbedCpuKernel(const OrtKernelInfo* info) : patch_(ReadEmbedPatch(info)) {}

OrtStatusPtr PatchEmbedCpuKernel::ComputeV2(OrtKernelContext* context) {
  return GuardStatus(
      [&]() -> OrtStatusPtr {
        Ort::KernelContext ctx(context);
        const EmbedValues v = ReadEmbedInputs(ctx);
        EmbedDims d;
        std::string err = CheckEmbedInputs(v, patch_, &d);
        if (!err.empty()) return MakeEmbedStatus(ORT_INVALID_ARGUMENT, err);
        if (v.images_type == ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16) return Compute<Ort::Float16_t>(ctx, v, d);
        return Compute<float>(ctx, v, d);  // float (CheckEmbedInputs allows float and float16)
      },
      kEmbedOpName);
}

}  // namespace raggedvit

// CPU kernel: every input as float (float16 converted once per call), the live rows [0, cu[B]) through
//   LN1 -> qkv GEMM (RaggedLinearCpuFloat) -> round to G -> attention (RaggedAttentionCpuFloat) -> round to G
//   -> proj GEMM -> x1 = round_S(x + ls1 * proj) -> LN2 -> fc1 GEMM + GELU -> round to G -> fc2 GEMM
//   -> y = round_S(x1 + ls2 * fc2)
// (vit_block_reference's roundings: S the stream type, G the GEMM type); dead rows of y and cls_attn are zero.
#include "vit_block_cpu.h"

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "float_convert.h"
#include "ragged_attention_cpu.h"
#include "ragged_linear_cpu.h"

namespace raggedvit {

namespace {

// count elements of v (float / float16 / bfloat16) as float.
std::vector<float> AsFloat(const Ort::ConstValue& v, ONNXTensorElementDataType type, int64_t count) {
  std::vector<float> out(static_cast<size_t>(count));
  switch (type) {
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT: {
      const float* p = v.GetTensorData<float>();
      std::copy(p, p + count, out.begin());
      break;
    }
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16: {
      const Ort::Float16_t* p = v.GetTensorData<Ort::Float16_t>();
      for (int64_t i = 0; i < count; ++i) out[static_cast<size_t>(i)] = ToFloat(p[i]);
      break;
    }
    default: {
      const Ort::BFloat16_t* p = v.GetTensorData<Ort::BFloat16_t>();
      for (int64_t i = 0; i < count; ++i) out[static_cast<size_t>(i)] = ToFloat(p[i]);
      break;
    }
  }
  return out;
}

// Rounds every value to `type` (a store to memory in that type), in place.
void RoundTo(ONNXTensorElementDataType type, float* p, int64_t count) {
  if (type == ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16) {
    for (int64_t i = 0; i < count; ++i) p[i] = ToFloat(FromFloat<Ort::Float16_t>(p[i]));
  } else if (type == ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16) {
    for (int64_t i = 0; i < count; ++i) p[i] = ToFloat(FromFloat<Ort::BFloat16_t>(p[i]));
  }
}

// out[r] = LayerNorm(x[r]) * gamma + beta for r < rows (statistics in double, as GatherLayerNorm's CPU kernel).
void LayerNorm(const float* x, const float* gamma, const float* beta, float* out, int64_t rows, int64_t C,
               float eps) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = x + r * C;
    double total = 0.0;
    for (int64_t c = 0; c < C; ++c) total += row[c];
    const double mean = total / static_cast<double>(C);
    double squares = 0.0;
    for (int64_t c = 0; c < C; ++c) squares += (row[c] - mean) * (row[c] - mean);
    const float rstd = static_cast<float>(1.0 / std::sqrt(squares / static_cast<double>(C) + eps));
    const float m = static_cast<float>(mean);
    for (int64_t c = 0; c < C; ++c) out[r * C + c] = (row[c] - m) * rstd * gamma[c] + beta[c];
  }
}

// x[r] += ls * a[r] (ls nullptr: 1) for r < rows, then rounded to `stream`.
void Residual(float* x, const float* a, const float* ls, int64_t rows, int64_t C, ONNXTensorElementDataType stream) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < C; ++c) x[r * C + c] += ls != nullptr ? ls[c] * a[r * C + c] : a[r * C + c];
  }
  RoundTo(stream, x, rows * C);
}

template <typename I>
OrtStatusPtr Compute(Ort::KernelContext& ctx, const BlockAttrs& attrs, const BlockValues& v, const BlockDims& d) {
  const I* cu = v.value[kBlockCu].GetTensorData<I>();
  Dims ad;  // the attention's dims over the same rows
  ad.T = d.T;
  ad.B = d.B;
  ad.H = d.H;
  ad.D = d.C / d.H;
  Attrs check;  // cu_seqlens values: no max_seqlen
  std::string err = CheckCuValues(cu, ad, check, v.info.shape[kBlockX]);
  if (!err.empty()) {  // CheckCuValues names the rows' input qkv (RaggedAttention's): here they are x
    const size_t at = err.find("qkv shape");
    if (at != std::string::npos) err.replace(at, 3, "x");
    return MakeBlockStatus(ORT_INVALID_ARGUMENT, err);
  }
  const int64_t T = d.T, C = d.C, F = d.F, live = static_cast<int64_t>(cu[d.B]);
  const ONNXTensorElementDataType S = v.info.type[kBlockX], G = v.info.type[kQkvWeight];

  auto y_value = ctx.GetOutput(0, {T, C});
  float* cls = nullptr;
  if (ctx.GetOutputCount() > 1) {
    auto cls_value = ctx.GetOutput(1, {T});
    if (cls_value) cls = cls_value.GetTensorMutableData<float>();
  }
  auto input = [&](size_t i, int64_t count) {
    return v.info.present[i] ? AsFloat(v.value[i], v.info.type[i], count) : std::vector<float>();
  };
  auto data = [](const std::vector<float>& t) { return t.empty() ? nullptr : t.data(); };
  // T*3C, 3C*C, T*F and F*C fit int64 bytes (CheckBlockInputs); live <= T (CheckCuValues)
  std::vector<float> x = input(kBlockX, live * C);
  const std::vector<float> n1w = input(kNorm1Weight, C), n1b = input(kNorm1Bias, C), n2w = input(kNorm2Weight, C),
                           n2b = input(kNorm2Bias, C), ls1 = input(kLs1, C), ls2 = input(kLs2, C);
  const std::vector<float> qkv_w = input(kQkvWeight, 3 * C * C), qkv_b = input(kQkvBias, 3 * C),
                           proj_w = input(kProjWeight, C * C), proj_b = input(kProjBias, C),
                           fc1_w = input(kFc1Weight, F * C), fc1_b = input(kFc1Bias, F),
                           fc2_w = input(kFc2Weight, C * F), fc2_b = input(kFc2Bias, C);

  // attention over the live rows only: its dims end at cu[B] (every sequence lies below it)
  Dims live_dims = ad;
  live_dims.T = live;
  std::vector<float> h(static_cast<size_t>(live * C)), qkv(static_cast<size_t>(live * 3 * C));
  std::vector<float> o(static_cast<size_t>(live * C)), a(static_cast<size_t>(live * F));
  LayerNorm(x.data(), n1w.data(), n1b.data(), h.data(), live, C, attrs.epsilon);
  RaggedLinearCpuFloat(ctx, h.data(), qkv_w.data(), data(qkv_b), qkv.data(), live, 3 * C, C, false);
  RoundTo(G, qkv.data(), live * 3 * C);
  err = RaggedAttentionCpuFloat(ctx, qkv.data(), o.data(), cls, cu, live_dims, attrs.scale);
  if (!err.empty()) return MakeBlockStatus(ORT_FAIL, err + " (x shape " + ShapeString(v.info.shape[kBlockX]) + ")");
  if (cls != nullptr) std::fill(cls + live, cls + T, 0.0f);
  RoundTo(G, o.data(), live * C);
  RaggedLinearCpuFloat(ctx, o.data(), proj_w.data(), data(proj_b), h.data(), live, C, C, false);
  Residual(x.data(), h.data(), data(ls1), live, C, S);  // x is x1 from here on
  LayerNorm(x.data(), n2w.data(), n2b.data(), h.data(), live, C, attrs.epsilon);
  RaggedLinearCpuFloat(ctx, h.data(), fc1_w.data(), data(fc1_b), a.data(), live, F, C, true);
  RoundTo(G, a.data(), live * F);
  RaggedLinearCpuFloat(ctx, a.data(), fc2_w.data(), data(fc2_b), h.data(), live, C, F, false);
  Residual(x.data(), h.data(), data(ls2), live, C, S);

  auto store = [&](auto* y) {
    using T_ = std::remove_pointer_t<decltype(y)>;
    for (int64_t i = 0; i < live * C; ++i) y[i] = FromFloat<T_>(x[static_cast<size_t>(i)]);
    std::fill(y + live * C, y + T * C, FromFloat<T_>(0.0f));  // dead rows
  };
  switch (S) {
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT: store(y_value.GetTensorMutableData<float>()); break;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16: store(y_value.GetTensorMutableData<Ort::Float16_t>()); break;
    default: store(y_value.GetTensorMutableData<Ort::BFloat16_t>()); break;
  }
  return nullptr;
}

}  // namespace

RaggedViTBlockCpuKernel::RaggedViTBlockCpuKernel(const BlockAttrs& attrs, const OrtKernelInfo*) : attrs_(attrs) {}

OrtStatusPtr RaggedViTBlockCpuKernel::ComputeV2(OrtKernelContext* context) {
  return GuardStatus(
      [&]() -> OrtStatusPtr {
        Ort::KernelContext ctx(context);
        const BlockValues v = ReadBlockInputs(ctx);
        BlockDims d;
        std::string err = CheckBlockInputs(v.info, attrs_, &d);
        if (!err.empty()) return MakeBlockStatus(ORT_INVALID_ARGUMENT, err);
        if (v.info.type[kBlockCu] == ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32) return Compute<int32_t>(ctx, attrs_, v, d);
        return Compute<int64_t>(ctx, attrs_, v, d);
      },
      kBlockOpName);
}

}  // namespace raggedvit

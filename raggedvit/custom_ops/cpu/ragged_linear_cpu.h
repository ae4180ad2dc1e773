// CPU EP kernel of com.raggedvit::RaggedLinear: float and float16 (fp32 accumulation, one rounding), rows split
// over ORT's intra-op pool; dead rows (r >= live) are zeroed.
#pragma once

#include "../ragged_linear.h"

namespace raggedvit {

struct RaggedLinearCpuKernel {
  RaggedLinearCpuKernel(const LinearAttrs& attrs, const OrtKernelInfo* info);
  OrtStatusPtr ComputeV2(OrtKernelContext* context);

 private:
  LinearAttrs attrs_;
};

using RaggedLinearCpuOp = RaggedLinearOp<RaggedLinearCpuKernel>;

// The kernel's GEMM on float rows, for ops that compose it (RaggedViTBlock): y[r] = act(x[r] w^T + bias) for
// r < live (x [live, K], w [N, K], bias [N] or nullptr, y [live, N]; act: GELU (erf) when gelu), fp32 accumulation.
void RaggedLinearCpuFloat(Ort::KernelContext& ctx, const float* x, const float* w, const float* bias, float* y,
                          int64_t live, int64_t N, int64_t K, bool gelu);

}  // namespace raggedvit

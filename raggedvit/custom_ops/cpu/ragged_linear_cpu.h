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

}  // namespace raggedvit

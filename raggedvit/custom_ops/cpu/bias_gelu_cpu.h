// CPU EP kernel of com.raggedvit::BiasGelu: float and float16, rows split over ORT's intra-op pool.
#pragma once

#include "../bias_gelu.h"

namespace raggedvit {

struct BiasGeluCpuKernel {
  explicit BiasGeluCpuKernel(const OrtKernelInfo* info);
  OrtStatusPtr ComputeV2(OrtKernelContext* context);
};

using BiasGeluCpuOp = BiasGeluOp<BiasGeluCpuKernel>;

}  // namespace raggedvit

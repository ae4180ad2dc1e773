// CUDA EP kernel of com.raggedvit::BiasGelu: enqueues the AOT Triton kernel (cuda/launcher.h: LaunchBiasGelu) on
// ORT's compute stream; no synchronisation, no host read of device data.
#pragma once

#include "../bias_gelu.h"

namespace raggedvit {

struct BiasGeluCudaKernel {
  explicit BiasGeluCudaKernel(const OrtKernelInfo* info);
  OrtStatusPtr ComputeV2(OrtKernelContext* context);
};

using BiasGeluCudaOp = BiasGeluOp<BiasGeluCudaKernel>;

}  // namespace raggedvit

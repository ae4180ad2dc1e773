// CUDA EP kernel of com.raggedvit::RaggedLinear: enqueues the AOT Triton kernel (cuda/launcher.h:
// LaunchRaggedLinear) on ORT's compute stream; no synchronisation, no host read of device data (the kernel reads
// CuSeqlens[B] itself).
#pragma once

#include "../ragged_linear.h"

namespace raggedvit {

struct RaggedLinearCudaKernel {
  RaggedLinearCudaKernel(const LinearAttrs& attrs, const OrtKernelInfo* info);
  OrtStatusPtr ComputeV2(OrtKernelContext* context);

 private:
  LinearAttrs attrs_;
};

using RaggedLinearCudaOp = RaggedLinearOp<RaggedLinearCudaKernel>;

}  // namespace raggedvit

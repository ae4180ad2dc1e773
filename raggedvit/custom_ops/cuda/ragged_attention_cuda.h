// CUDA EP kernel of com.raggedvit::RaggedAttention: enqueues the AOT Triton kernels (cuda/launcher.h) on
// ORT's compute stream; no synchronisation, no host read of device data.
#pragma once

#include "../ragged_attention.h"

namespace raggedvit {

constexpr const char* kCudaExecutionProvider = "CUDAExecutionProvider";

struct RaggedAttentionCudaKernel {
  RaggedAttentionCudaKernel(const Attrs& attrs, const OrtKernelInfo* info);
  OrtStatusPtr ComputeV2(OrtKernelContext* context);

 private:
  Attrs attrs_;
};

using RaggedAttentionCudaOp = RaggedAttentionOp<RaggedAttentionCudaKernel>;

}  // namespace raggedvit

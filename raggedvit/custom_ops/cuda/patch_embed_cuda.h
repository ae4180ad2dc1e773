// CUDA EP kernel of com.raggedvit::PatchEmbed: enqueues the AOT Triton kernel (cuda/launcher.h: LaunchPatchEmbed)
// on ORT's compute stream; no synchronisation, no host read of device data.
#pragma once

#include "../patch_embed.h"

namespace raggedvit {

struct PatchEmbedCudaKernel {
  explicit PatchEmbedCudaKernel(const OrtKernelInfo* info);
  OrtStatusPtr ComputeV2(OrtKernelContext* context);

 private:
  int64_t patch_;
};

using PatchEmbedCudaOp = PatchEmbedOp<PatchEmbedCudaKernel>;

}  // namespace raggedvit

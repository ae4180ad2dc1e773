// CPU EP kernel of com.raggedvit::PatchEmbed: float and float16 images, rows split over ORT's intra-op pool.
#pragma once

#include "../patch_embed.h"

namespace raggedvit {

struct PatchEmbedCpuKernel {
  explicit PatchEmbedCpuKernel(const OrtKernelInfo* info);
  OrtStatusPtr ComputeV2(OrtKernelContext* context);

 private:
  int64_t patch_;
};

using PatchEmbedCpuOp = PatchEmbedOp<PatchEmbedCpuKernel>;

}  // namespace raggedvit

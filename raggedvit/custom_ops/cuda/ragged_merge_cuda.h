// CUDA EP kernel of com.raggedvit::RaggedMerge: enqueues the AOT Triton merge kernel (cuda/launcher.h:
// LaunchRaggedMerge) on ORT's compute stream, one program per image; no synchronisation, no host read of device data
// (n = T / B from the shapes; cu is never read).
#pragma once

#include "../ragged_merge.h"

namespace raggedvit {

struct RaggedMergeCudaKernel {
  RaggedMergeCudaKernel(const MergeAttrs& attrs, const OrtKernelInfo* info);
  OrtStatusPtr ComputeV2(OrtKernelContext* context);

 private:
  MergeAttrs attrs_;
};

using RaggedMergeCudaOp = RaggedMergeOp<RaggedMergeCudaKernel>;

}  // namespace raggedvit

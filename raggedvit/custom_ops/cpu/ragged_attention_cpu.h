// CPU EP kernel of com.raggedvit::RaggedAttention: multi-threaded C++ through ORT's intra-op pool,
// fp32 accumulation for every input type, any head dim.
#pragma once

#include "../ragged_attention.h"

namespace raggedvit {

struct RaggedAttentionCpuKernel {
  RaggedAttentionCpuKernel(const Attrs& attrs, const OrtKernelInfo* info);
  OrtStatusPtr ComputeV2(OrtKernelContext* context);

 private:
  Attrs attrs_;
};

using RaggedAttentionCpuOp = RaggedAttentionOp<RaggedAttentionCpuKernel>;

}  // namespace raggedvit

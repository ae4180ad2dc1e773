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

// The kernel's attention on float rows, for ops that compose it (RaggedViTBlock): qkv [T, 3*H*D] float (no
// bias), out [T, H*D], cls [T] or nullptr; cu [B+1] checked by CheckCuValues. The dead rows [cu[B], T) of out and
// cls are zeroed. "" on success, else the error text.
template <typename I>
std::string RaggedAttentionCpuFloat(Ort::KernelContext& ctx, const float* qkv, float* out, float* cls, const I* cu,
                                    const Dims& d, float scale);

}  // namespace raggedvit

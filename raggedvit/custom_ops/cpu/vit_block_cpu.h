// CPU EP kernel of com.raggedvit::RaggedViTBlock: the block composed from the CPU kernels of RaggedLinear and
// RaggedAttention on float rows, stream and GEMM types float or float16 (fp32 arithmetic, rounded where the
// reference rounds).
#pragma once

#include "../vit_block.h"

namespace raggedvit {

struct RaggedViTBlockCpuKernel {
  RaggedViTBlockCpuKernel(const BlockAttrs& attrs, const OrtKernelInfo* info);
  OrtStatusPtr ComputeV2(OrtKernelContext* context);

 private:
  BlockAttrs attrs_;
};

using RaggedViTBlockCpuOp = RaggedViTBlockOp<RaggedViTBlockCpuKernel>;

}  // namespace raggedvit

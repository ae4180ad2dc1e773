// CUDA EP kernel of com.raggedvit::RaggedViTBlock: the block engine's AOT cubin (cuda/launcher.h: LaunchVitBlock),
// one cooperative launch per block on ORT's compute stream, with scratch from ORT's allocator; no synchronisation
// and no host read of device data (the kernel reads cu_seqlens[B] itself). Registered for x float and float16 with
// int64 cu_seqlens; what the cubins do not cover (other GEMM types, absent biases, head dims above 64) is an error
// that names the input, not a silent fallback.
#pragma once

#include "../vit_block.h"

namespace raggedvit {

struct RaggedViTBlockCudaKernel {
  RaggedViTBlockCudaKernel(const BlockAttrs& attrs, const OrtKernelInfo* info);
  OrtStatusPtr ComputeV2(OrtKernelContext* context);

 private:
  BlockAttrs attrs_;
};

using RaggedViTBlockCudaOp = RaggedViTBlockOp<RaggedViTBlockCudaKernel>;

}  // namespace raggedvit

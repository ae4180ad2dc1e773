// CPU EP kernel of com.raggedvit::RaggedMerge: the merge of raggedvit/pruning/merge.py (merge_tokens_reference) on
// the host, one task per image.
#pragma once

#include "../ragged_merge.h"

namespace raggedvit {

struct RaggedMergeCpuKernel {
  RaggedMergeCpuKernel(const MergeAttrs& attrs, const OrtKernelInfo* info);
  OrtStatusPtr ComputeV2(OrtKernelContext* context);

 private:
  MergeAttrs attrs_;
};

using RaggedMergeCpuOp = RaggedMergeOp<RaggedMergeCpuKernel>;

}  // namespace raggedvit

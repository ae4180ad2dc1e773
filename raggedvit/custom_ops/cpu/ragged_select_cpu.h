// CPU EP kernel of com.raggedvit::RaggedSelect: the stage math of raggedvit/pruning/select.py
// (select_rows_reference) on the host, image by image.
#pragma once

#include "../ragged_select.h"

namespace raggedvit {

struct RaggedSelectCpuKernel {
  RaggedSelectCpuKernel(const SelectAttrs& attrs, const OrtKernelInfo* info);
  OrtStatusPtr ComputeV2(OrtKernelContext* context);

 private:
  SelectAttrs attrs_;
};

using RaggedSelectCpuOp = RaggedSelectOp<RaggedSelectCpuKernel>;

}  // namespace raggedvit

// CUDA EP kernel of com.raggedvit::RaggedSelect: enqueues the AOT Triton selection kernels (cuda/launcher.h:
// LaunchRaggedSelect) on ORT's compute stream; no synchronisation, no host read of device data (the kernels
// read and clamp cu themselves).
#pragma once

#include "../ragged_select.h"

namespace raggedvit {

struct RaggedSelectCudaKernel {
  RaggedSelectCudaKernel(const SelectAttrs& attrs, const OrtKernelInfo* info);
  OrtStatusPtr ComputeV2(OrtKernelContext* context);

 private:
  SelectAttrs attrs_;
};

using RaggedSelectCudaOp = RaggedSelectOp<RaggedSelectCudaKernel>;

}  // namespace raggedvit

// CUDA EP kernel of com.raggedvit::GatherLayerNorm: enqueues the AOT Triton kernel (cuda/launcher.h:
// LaunchGatherLayerNorm) on ORT's compute stream; no synchronisation, no host read of device data.
#pragma once

#include "../gather_layer_norm.h"

namespace raggedvit {

struct GatherLayerNormCudaKernel {
  explicit GatherLayerNormCudaKernel(const OrtKernelInfo* info);
  OrtStatusPtr ComputeV2(OrtKernelContext* context);

 private:
  float epsilon_;
};

using GatherLayerNormCudaOp = GatherLayerNormOp<GatherLayerNormCudaKernel>;

}  // namespace raggedvit

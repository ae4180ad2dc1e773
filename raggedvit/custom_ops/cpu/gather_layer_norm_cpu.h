// CPU EP kernel of com.raggedvit::GatherLayerNorm: float and float16, rows split over ORT's intra-op pool.
#pragma once

#include "../gather_layer_norm.h"

namespace raggedvit {

struct GatherLayerNormCpuKernel {
  explicit GatherLayerNormCpuKernel(const OrtKernelInfo* info);
  OrtStatusPtr ComputeV2(OrtKernelContext* context);

 private:
  float epsilon_;
};

using GatherLayerNormCpuOp = GatherLayerNormOp<GatherLayerNormCpuKernel>;

}  // namespace raggedvit

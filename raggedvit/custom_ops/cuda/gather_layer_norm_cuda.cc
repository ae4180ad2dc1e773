// ORT-facing part of the CUDA GatherLayerNorm kernel: argument checks, output allocation, then the launcher.
#include "gather_layer_norm_cuda.h"

#include "launcher.h"

namespace raggedvit {

GatherLayerNormCudaKernel::GatherLayerNormCudaKernel(const OrtKernelInfo* info) : epsilon_(ReadNormEpsilon(info)) {}

OrtStatusPtr GatherLayerNormCudaKernel::ComputeV2(OrtKernelContext* context) {
  return GuardStatus(
      [&]() -> OrtStatusPtr {
        Ort::KernelContext ctx(context);
        const NormValues v = ReadNormInputs(ctx);
        NormDims d;
        std::string err = CheckNormInputs(v, &d);
        if (!err.empty()) return MakeNormStatus(ORT_INVALID_ARGUMENT, err);
        cuda::NormLaunch n;
        switch (v.x_type) {
          case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16: n.dtype = cuda::DType::kFloat16; break;
          case ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16: n.dtype = cuda::DType::kBFloat16; break;
          default:
            return MakeNormStatus(ORT_INVALID_ARGUMENT, "input 'X' (shape " + ShapeString(v.x_shape) +
                                                            ") has element type " + ElementTypeName(v.x_type) +
                                                            "; the CUDA EP supports float16 and bfloat16");
        }
        n.index_type = v.cu_type == ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64 ? cuda::IndexType::kInt64
                                                                        : cuda::IndexType::kInt32;
        n.T = d.T;
        n.R = d.R;
        n.D = d.D;
        n.B = d.B;
        n.epsilon = epsilon_;
        const std::vector<int64_t> out_shape{d.R, d.D};
        auto normed = ctx.GetOutput(0, out_shape);
        auto sum = ctx.GetOutput(1, out_shape);
        n.x = v.x.GetTensorRawData();
        n.index = v.index.GetTensorRawData();
        n.gamma = v.gamma.GetTensorRawData();
        n.beta = v.beta.GetTensorRawData();
        n.skip = v.has_skip ? v.skip.GetTensorRawData() : nullptr;
        n.bias = v.has_bias ? v.bias.GetTensorRawData() : nullptr;
        n.cu = v.has_cu ? v.cu.GetTensorRawData() : nullptr;  // read on the device only
        n.normed = normed.GetTensorMutableRawData();
        n.sum = sum.GetTensorMutableRawData();
        n.stream = ctx.GetGPUComputeStream();
        n.device_ordinal = v.x.GetTensorMemoryInfo().GetDeviceId();
        const std::string shapes = " (X shape " + ShapeString(v.x_shape) + ", Index shape " +
                                   ShapeString(v.index_shape) + ")";
        err = cuda::CheckNormSupported(n);
        if (!err.empty()) return MakeNormStatus(ORT_INVALID_ARGUMENT, err + shapes);
        err = cuda::LaunchGatherLayerNorm(n);
        if (!err.empty()) return MakeNormStatus(ORT_RUNTIME_EXCEPTION, err + shapes);
        return nullptr;
      },
      kNormOpName);
}

}  // namespace raggedvit

// ORT-facing part of the CUDA BiasGelu kernel: argument checks, output allocation, then the launcher.
#include "bias_gelu_cuda.h"

#include "launcher.h"

namespace raggedvit {

BiasGeluCudaKernel::BiasGeluCudaKernel(const OrtKernelInfo*) {}

OrtStatusPtr BiasGeluCudaKernel::ComputeV2(OrtKernelContext* context) {
  return GuardStatus(
      [&]() -> OrtStatusPtr {
        Ort::KernelContext ctx(context);
        const GeluValues v = ReadGeluInputs(ctx);
        GeluDims d;
        std::string err = CheckGeluInputs(v, &d);
        if (!err.empty()) return MakeGeluStatus(ORT_INVALID_ARGUMENT, err);
        cuda::GeluLaunch g;
        switch (v.x_type) {
          case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16: g.dtype = cuda::DType::kFloat16; break;
          case ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16: g.dtype = cuda::DType::kBFloat16; break;
          default:
            return MakeGeluStatus(ORT_INVALID_ARGUMENT, "input 'X' (shape " + ShapeString(v.x_shape) +
                                                            ") has element type " + ElementTypeName(v.x_type) +
                                                            "; the CUDA EP supports float16 and bfloat16");
        }
        g.M = d.M;
        g.N = d.N;
        auto y = ctx.GetOutput(0, v.x_shape);
        g.x = v.x.GetTensorRawData();
        g.bias = v.has_bias ? v.bias.GetTensorRawData() : nullptr;
        g.y = y.GetTensorMutableRawData();
        g.stream = ctx.GetGPUComputeStream();
        g.device_ordinal = v.x.GetTensorMemoryInfo().GetDeviceId();
        const std::string shapes = " (X shape " + ShapeString(v.x_shape) + ")";
        err = cuda::CheckGeluSupported(g);
        if (!err.empty()) return MakeGeluStatus(ORT_INVALID_ARGUMENT, err + shapes);
        err = cuda::LaunchBiasGelu(g);
        if (!err.empty()) return MakeGeluStatus(ORT_RUNTIME_EXCEPTION, err + shapes);
        return nullptr;
      },
      kGeluOpName);
}

}  // namespace raggedvit

// ORT-facing part of the CUDA RaggedLinear kernel: argument checks, output allocation, then the launcher.
#include "ragged_linear_cuda.h"

#include "launcher.h"

namespace raggedvit {

RaggedLinearCudaKernel::RaggedLinearCudaKernel(const LinearAttrs& attrs, const OrtKernelInfo*) : attrs_(attrs) {}

OrtStatusPtr RaggedLinearCudaKernel::ComputeV2(OrtKernelContext* context) {
  return GuardStatus(
      [&]() -> OrtStatusPtr {
        Ort::KernelContext ctx(context);
        const LinearValues v = ReadLinearInputs(ctx);
        LinearDims d;
        std::string err = CheckLinearInputs(v.info, &d);
        if (!err.empty()) return MakeLinearStatus(ORT_INVALID_ARGUMENT, err);
        cuda::LinearLaunch l;
        switch (v.info.x_type) {
          case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16: l.dtype = cuda::DType::kFloat16; break;
          case ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16: l.dtype = cuda::DType::kBFloat16; break;
          default:
            return MakeLinearStatus(ORT_INVALID_ARGUMENT, "input 'X' (shape " + ShapeString(v.info.x) +
                                                              ") has element type " +
                                                              ElementTypeName(v.info.x_type) +
                                                              "; the CUDA EP supports float16 and bfloat16");
        }
        l.index_type = v.info.cu_type == ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64 ? cuda::IndexType::kInt64
                                                                             : cuda::IndexType::kInt32;
        l.T = d.T;
        l.N = d.N;
        l.K = d.K;
        l.B = d.B;
        l.activation = static_cast<int>(attrs_.activation);
        auto y = ctx.GetOutput(0, {d.T, d.N});
        l.x = v.x.GetTensorRawData();
        l.w = v.w.GetTensorRawData();
        l.bias = v.info.has_bias ? v.bias.GetTensorRawData() : nullptr;
        l.residual = v.info.has_residual ? v.residual.GetTensorRawData() : nullptr;
        l.cu = v.info.has_cu ? v.cu.GetTensorRawData() : nullptr;
        l.y = y.GetTensorMutableRawData();
        l.stream = ctx.GetGPUComputeStream();
        l.device_ordinal = v.x.GetTensorMemoryInfo().GetDeviceId();
        const std::string shapes = " (X shape " + ShapeString(v.info.x) + ", W shape " + ShapeString(v.info.w) + ")";
        err = cuda::CheckLinearSupported(l);
        if (!err.empty()) return MakeLinearStatus(ORT_INVALID_ARGUMENT, err + shapes);
        err = cuda::LaunchRaggedLinear(l);
        if (!err.empty()) return MakeLinearStatus(ORT_RUNTIME_EXCEPTION, err + shapes);
        return nullptr;
      },
      kLinearOpName);
}

}  // namespace raggedvit

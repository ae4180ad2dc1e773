// ORT-facing part of the CUDA PatchEmbed kernel: argument checks, output allocation, then the launcher.
#include "patch_embed_cuda.h"

#include "launcher.h"

namespace raggedvit {

PatchEmbedCudaKernel::PatchEmbedCudaKernel(const OrtKernelInfo* info) : patch_(ReadEmbedPatch(info)) {}

OrtStatusPtr PatchEmbedCudaKernel::ComputeV2(OrtKernelContext* context) {
  return GuardStatus(
      [&]() -> OrtStatusPtr {
        Ort::KernelContext ctx(context);
        const EmbedValues v = ReadEmbedInputs(ctx);
        EmbedDims d;
        std::string err = CheckEmbedInputs(v, patch_, &d);
        if (!err.empty()) return MakeEmbedStatus(ORT_INVALID_ARGUMENT, err);
        cuda::EmbedLaunch e;
        e.dtype = v.images_type == ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16 ? cuda::DType::kFloat16
                                                                         : cuda::DType::kFloat32;
        e.B = d.B;
        e.C = d.C;
        e.H = d.H;
        e.W = d.W;
        e.patch = d.patch;
        e.P = d.P;
        e.N = d.N;
        auto out = ctx.GetOutput(0, std::vector<int64_t>{d.B, d.P + d.L, d.N});
        e.images = v.images.GetTensorRawData();
        e.weight = v.weight.GetTensorRawData();
        e.prefix = v.prefix.GetTensorRawData();
        e.pos = v.pos.GetTensorRawData();
        e.out = out.GetTensorMutableRawData();
        e.stream = ctx.GetGPUComputeStream();
        e.device_ordinal = v.images.GetTensorMemoryInfo().GetDeviceId();
        const std::string shapes = " (Images shape " + ShapeString(v.images_shape) + ", Weight shape " +
                                   ShapeString(v.weight_shape) + ", patch " + std::to_string(patch_) + ")";
        err = cuda::CheckEmbedSupported(e);
        if (!err.empty()) return MakeEmbedStatus(ORT_INVALID_ARGUMENT, err + shapes);
        err = cuda::LaunchPatchEmbed(e);
        if (!err.empty()) return MakeEmbedStatus(ORT_RUNTIME_EXCEPTION, err + shapes);
        return nullptr;
      },
      kEmbedOpName);
}

}  // namespace raggedvit

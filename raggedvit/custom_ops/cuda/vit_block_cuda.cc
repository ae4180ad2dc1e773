// ORT-facing part of the CUDA RaggedViTBlock kernel: argument checks (CheckBlockInputs), outputs, the workspace
// from ORT's allocator, then the launcher.
#include "vit_block_cuda.h"

#include "launcher.h"
#include "ort_scratch.h"

namespace raggedvit {

RaggedViTBlockCudaKernel::RaggedViTBlockCudaKernel(const BlockAttrs& attrs, const OrtKernelInfo*) : attrs_(attrs) {}

OrtStatusPtr RaggedViTBlockCudaKernel::ComputeV2(OrtKernelContext* context) {
  return GuardStatus(
      [&]() -> OrtStatusPtr {
        Ort::KernelContext ctx(context);
        const BlockValues v = ReadBlockInputs(ctx);
        BlockDims d;
        std::string err = CheckBlockInputs(v.info, attrs_, &d);
        if (!err.empty()) return MakeBlockStatus(ORT_INVALID_ARGUMENT, err);
        const std::string shapes = " (x shape " + ShapeString(v.info.shape[kBlockX]) + ", fc1_weight shape " +
                                   ShapeString(v.info.shape[kFc1Weight]) + ")";
        cuda::BlockLaunch b;
        if (!ToLaunchType(v.info.type[kBlockX], &b.stream_dtype) ||
            !ToLaunchType(v.info.type[kQkvWeight], &b.gemm_dtype)) {
          return MakeBlockStatus(ORT_INVALID_ARGUMENT, "unsupported element type" + shapes);
        }
        b.index_type = v.info.type[kBlockCu] == ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64 ? cuda::IndexType::kInt64
                                                                                    : cuda::IndexType::kInt32;
        b.T = d.T;
        b.C = d.C;
        b.F = d.F;
        b.B = d.B;
        b.H = d.H;
        b.epsilon = attrs_.epsilon;
        b.scale = attrs_.scale;
        b.x = v.value[kBlockX].GetTensorRawData();
        b.cu = v.value[kBlockCu].GetTensorRawData();
        for (int i = 0; i < cuda::kNumBlockWeights; ++i) {
          const size_t input = static_cast<size_t>(i) + kNorm1Weight;
          b.w[i] = v.info.present[input] ? v.value[input].GetTensorRawData() : nullptr;
        }
        auto y = ctx.GetOutput(0, {d.T, d.C});
        b.y = y.GetTensorMutableRawData();
        if (ctx.GetOutputCount() > 1) {
          auto cls = ctx.GetOutput(1, {d.T});
          if (cls) b.cls_attn = cls.GetTensorMutableData<float>();
        }
        b.stream = ctx.GetGPUComputeStream();
        auto mem = v.value[kBlockX].GetTensorMemoryInfo();
        b.device_ordinal = mem.GetDeviceId();
        err = cuda::CheckBlockSupported(b);  // before the workspace: b.workspace is still null (aligned)
        if (!err.empty()) return MakeBlockStatus(ORT_INVALID_ARGUMENT, err + shapes);
        size_t bytes = 0;
        err = cuda::BlockWorkspaceBytes(b, &bytes);
        if (!err.empty()) return MakeBlockStatus(ORT_INVALID_ARGUMENT, err + shapes);
        Scratch ws;
        const OrtMemoryInfo* mem_info = mem;
        Ort::ThrowOnError(Ort::GetApi().KernelContext_GetAllocator(context, mem_info, &ws.allocator));
        Ort::ThrowOnError(Ort::GetApi().KernelContext_GetScratchBuffer(context, mem_info, bytes, &ws.ptr));
        b.workspace = ws.ptr;
        err = cuda::LaunchVitBlock(b);
        if (!err.empty()) return MakeBlockStatus(ORT_RUNTIME_EXCEPTION, err + shapes);
        return nullptr;
      },
      kBlockOpName);
}

}  // namespace raggedvit

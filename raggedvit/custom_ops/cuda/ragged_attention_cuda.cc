// ORT-facing part of the CUDA kernel: shape checks, output allocation, lse scratch, then the launcher.
#include "ragged_attention_cuda.h"

#include "launcher.h"
#include "ort_scratch.h"

namespace raggedvit {

RaggedAttentionCudaKernel::RaggedAttentionCudaKernel(const Attrs& attrs, const OrtKernelInfo*) : attrs_(attrs) {}

OrtStatusPtr RaggedAttentionCudaKernel::ComputeV2(OrtKernelContext* context) {
  return GuardStatus([&]() -> OrtStatusPtr {
    Ort::KernelContext ctx(context);
    Ort::ConstValue qkv = ctx.GetInput(0);
    Ort::ConstValue cu = ctx.GetInput(1);
    auto qkv_info = qkv.GetTensorTypeAndShapeInfo();
    auto cu_info = cu.GetTensorTypeAndShapeInfo();
    const std::vector<int64_t> qkv_shape = qkv_info.GetShape();
    Dims d;
    std::string err = CheckShapes(qkv_shape, cu_info.GetShape(), attrs_.num_heads, &d);
    if (!err.empty()) return MakeStatus(ORT_INVALID_ARGUMENT, err);

    cuda::AttentionLaunch a;
    if (!ToLaunchType(qkv_info.GetElementType(), &a.dtype)) {
      return MakeStatus(ORT_INVALID_ARGUMENT, std::string("input 'qkv' (shape ") + ShapeString(qkv_shape) +
                                                  ") has element type " + ElementTypeName(qkv_info.GetElementType()) +
                                                  "; supported: float16, float, bfloat16");
    }
    const auto cu_type = cu_info.GetElementType();
    if (cu_type != ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32 && cu_type != ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64) {
      return MakeStatus(ORT_INVALID_ARGUMENT,
                        std::string("input 'cu_seqlens' must be int32 or int64, got ") + ElementTypeName(cu_type));
    }
    a.index_type = cu_type == ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32 ? cuda::IndexType::kInt32 : cuda::IndexType::kInt64;
    const void* table = nullptr;
    const void* tokens = nullptr;
    err = ReadPosInputs(ctx, attrs_, qkv_shape, cu_type, &table, &tokens);
    if (!err.empty()) return MakeStatus(ORT_INVALID_ARGUMENT, err);
    a.pos_table = table;
    a.token_pos = tokens;
    const float* key_bias = nullptr;
    err = ReadKeyBias(ctx, qkv_shape, &key_bias);
    if (!err.empty()) return MakeStatus(ORT_INVALID_ARGUMENT, err);
    a.key_bias = key_bias;
    if (table != nullptr) {
      a.grid_h = attrs_.grid_h;
      a.grid_w = attrs_.grid_w;
      a.num_prefix = attrs_.num_prefix;
    }
    a.T = d.T;
    a.B = d.B;
    a.H = d.H;
    a.D = d.D;
    a.scale = attrs_.has_scale ? attrs_.scale : 1.0f / std::sqrt(static_cast<float>(d.D));
    if (d.T > 0) {
      err = cuda::CheckSupported(a);
      if (!err.empty()) return MakeStatus(ORT_INVALID_ARGUMENT, err + " (qkv shape " + ShapeString(qkv_shape) + ")");
    }

    auto out = ctx.GetOutput(0, {d.T, d.H * d.D});
    a.out = out.GetTensorMutableRawData();
    if (ctx.GetOutputCount() > 1) {
      auto cls = ctx.GetOutput(1, {d.T});
      if (cls) a.cls_attn = cls.GetTensorMutableRawData();
    }
    if (d.T == 0) return nullptr;  // empty grid: outputs are empty, nothing to launch

    a.qkv = qkv.GetTensorRawData();
    if (ctx.GetInputCount() > kBiasInput) {
      Ort::ConstValue bias = ctx.GetInput(kBiasInput);
      if (bias) {
        auto bias_info = bias.GetTensorTypeAndShapeInfo();
        err = CheckBias(bias_info.GetShape(), bias_info.GetElementType(), qkv_shape, qkv_info.GetElementType());
        if (!err.empty()) return MakeStatus(ORT_INVALID_ARGUMENT, err);
        a.bias = bias.GetTensorRawData();
      }
    }
    a.cu = cu.GetTensorRawData();
    a.stream = ctx.GetGPUComputeStream();
    auto mem = qkv.GetTensorMemoryInfo();
    a.device_ordinal = mem.GetDeviceId();
    Scratch lse;
    if (a.cls_attn != nullptr) {
      const OrtMemoryInfo* mem_info = mem;
      Ort::ThrowOnError(Ort::GetApi().KernelContext_GetAllocator(context, mem_info, &lse.allocator));
      int64_t lse_elements = 0;  // [H, T] float; CheckSupported bounded T*3*H*D, checked again here
      if (!CheckedMul(d.H, d.T, &lse_elements)) {
        return MakeStatus(ORT_INVALID_ARGUMENT, "lse scratch [H, T] overflows int64 (qkv shape " +
                                                    ShapeString(qkv_shape) + ")");
      }
      const size_t bytes = static_cast<size_t>(lse_elements) * sizeof(float);
      Ort::ThrowOnError(Ort::GetApi().KernelContext_GetScratchBuffer(context, mem_info, bytes, &lse.ptr));
      a.lse = lse.ptr;
    }
    err = cuda::LaunchRaggedAttention(a);
    if (!err.empty()) return MakeStatus(ORT_RUNTIME_EXCEPTION, err);
    return nullptr;
  });
}

}  // namespace raggedvit

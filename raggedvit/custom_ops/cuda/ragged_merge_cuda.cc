// ORT-facing part of the CUDA RaggedMerge kernel: argument checks (CheckMergeInputs: shapes and types only), output
// allocation, then the launcher (which checks what the cubins support: dtype, C and Dh multiples of 16, n_A and Dh
// within the compiled widths, alignment).
#include "ragged_merge_cuda.h"

#include "launcher.h"

namespace raggedvit {

RaggedMergeCudaKernel::RaggedMergeCudaKernel(const MergeAttrs& attrs, const OrtKernelInfo*) : attrs_(attrs) {}

OrtStatusPtr RaggedMergeCudaKernel::ComputeV2(OrtKernelContext* context) {
  return GuardStatus(
      [&]() -> OrtStatusPtr {
        Ort::KernelContext ctx(context);
        const MergeValues v = ReadMergeInputs(ctx);
        MergeDims d;
        std::string err = CheckMergeInputs(v.info, attrs_, &d);
        if (!err.empty()) return MakeMergeStatus(ORT_INVALID_ARGUMENT, err);
        const int64_t rows = d.B * d.m, scores = d.B * d.n_A;  // <= T: CheckMergeInputs checked T * C and T
        cuda::MergeLaunch l;
        l.dtype = v.info.x_type == ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT     ? cuda::DType::kFloat32
                  : v.info.x_type == ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16 ? cuda::DType::kFloat16
                                                                           : cuda::DType::kBFloat16;
        l.x = v.x.GetTensorRawData();
        l.qkv = v.qkv.GetTensorRawData();
        if (v.info.has_qkv_bias) l.qkv_bias = v.qkv_bias.GetTensorRawData();
        if (v.info.has_size) l.size = v.size.GetTensorRawData();
        if (v.info.has_skip) l.skip = v.skip.GetTensorRawData();
        if (v.info.has_skip_bias) l.skip_bias = v.skip_bias.GetTensorRawData();
        l.x_out = ctx.GetOutput(kMergeXOut, {rows, d.C}).GetTensorMutableRawData();
        l.size_out = ctx.GetOutput(kMergeSizeOut, {rows}).GetTensorMutableRawData();
        l.cu_out = ctx.GetOutput(kMergeCuOut, {d.B + 1}).GetTensorMutableRawData();
        l.src = ctx.GetOutput(kMergeSrc, {rows}).GetTensorMutableRawData();
        l.key_bias = ctx.GetOutput(kMergeKeyBias, {rows}).GetTensorMutableRawData();
        l.score = ctx.GetOutput(kMergeScore, {scores}).GetTensorMutableRawData();
        l.T = d.T;
        l.B = d.B;
        l.C = d.C;
        l.H = d.H;
        l.Dh = d.Dh;
        l.num_prefix = attrs_.num_prefix;
        l.r = attrs_.r;
        l.class_token = attrs_.class_token;
        l.stream = ctx.GetGPUComputeStream();
        l.device_ordinal = v.x.GetTensorMemoryInfo().GetDeviceId();
        const std::string shapes = " (x shape " + ShapeString(v.info.x) + ", qkv shape " + ShapeString(v.info.qkv) +
                                   ", cu shape " + ShapeString(v.info.cu) + ")";
        err = cuda::CheckMergeSupported(l);
        if (!err.empty()) return MakeMergeStatus(ORT_INVALID_ARGUMENT, err + shapes);
        err = cuda::LaunchRaggedMerge(l);
        if (!err.empty()) return MakeMergeStatus(ORT_RUNTIME_EXCEPTION, err + shapes);
        return nullptr;
      },
      kMergeOpName);
}

}  // namespace raggedvit

// ORT-facing part of the CUDA RaggedSelect kernel: argument checks, output allocation, then the launcher. The k
// output doubles as the buffer between the two launches (the first writes it, the second reads it).
#include "ragged_select_cuda.h"

#include "launcher.h"

namespace raggedvit {

RaggedSelectCudaKernel::RaggedSelectCudaKernel(const SelectAttrs& attrs, const OrtKernelInfo*) : attrs_(attrs) {}

OrtStatusPtr RaggedSelectCudaKernel::ComputeV2(OrtKernelContext* context) {
  return GuardStatus(
      [&]() -> OrtStatusPtr {
        Ort::KernelContext ctx(context);
        const auto scores_v = ctx.GetInput(kSelectScores), cu_v = ctx.GetInput(kSelectCu);
        const auto s_info = scores_v.GetTensorTypeAndShapeInfo(), c_info = cu_v.GetTensorTypeAndShapeInfo();
        SelectDims d;
        std::string err = CheckSelectInputs(s_info.GetShape(), s_info.GetElementType(), c_info.GetShape(),
                                            c_info.GetElementType(), attrs_, &d);
        if (!err.empty()) return MakeSelectStatus(ORT_INVALID_ARGUMENT, err);
        cuda::SelectLaunch l;
        l.scores = scores_v.GetTensorRawData();
        l.cu = cu_v.GetTensorRawData();
        l.src = ctx.GetOutput(kSelectSrc, {d.rows}).GetTensorMutableRawData();
        l.cu_new = ctx.GetOutput(kSelectCuNew, {d.B + 1}).GetTensorMutableRawData();
        l.seq_id = ctx.GetOutput(kSelectSeqId, {d.rows}).GetTensorMutableRawData();
        l.pos = ctx.GetOutput(kSelectPos, {d.rows}).GetTensorMutableRawData();
        l.k = ctx.GetOutput(kSelectK, {d.B}).GetTensorMutableRawData();
        l.T = d.T;
        l.B = d.B;
        l.width = attrs_.width;
        l.bound = attrs_.bound;
        l.num_prefix = attrs_.num_prefix;
        l.policy = attrs_.policy;
        l.keep = attrs_.keep;
        l.mass = attrs_.mass;
        l.stream = ctx.GetGPUComputeStream();
        l.device_ordinal = cu_v.GetTensorMemoryInfo().GetDeviceId();
        const std::string shapes = " (scores shape " + ShapeString(s_info.GetShape()) + ", cu shape " +
                                   ShapeString(c_info.GetShape()) + ")";
        err = cuda::CheckSelectSupported(l);
        if (!err.empty()) return MakeSelectStatus(ORT_INVALID_ARGUMENT, err + shapes);
        err = cuda::LaunchRaggedSelect(l);
        if (!err.empty()) return MakeSelectStatus(ORT_RUNTIME_EXCEPTION, err + shapes);
        return nullptr;
      },
      kSelectOpName);
}

}  // namespace raggedvit

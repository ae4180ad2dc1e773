// com.raggedvit::GatherLayerNorm v1: argument checks and the op definition shared by the CPU and CUDA kernels. No
// CUDA here.
//
//   X      [T, D]  float | float16 (CPU EP), float16 | bfloat16 (CUDA EP): the residual stream
//   Index  [R]     int64: rows of X to gather (i < 0 counts from the end; i outside [-T, T) gives zero rows)
//   Gamma  [D]     X's type (the LayerNorm's weight)
//   Beta   [D]     X's type (the LayerNorm's bias)
//   Skip   [T, D]  X's type (optional input: the block's branch output, added to X)
//   Bias   [D]     X's type (optional input: the branch's bias, added too)
//   CuSeqlens [B+1] int32 | int64, B >= 0 (optional input): live = clamp(CuSeqlens[B], 0, R) output rows, else
//                  live = R (the capacity layout's live count, as RaggedLinear's; only CuSeqlens[B] is read)
//   attribute epsilon: float >= 0 (default 1e-5; an int or other type is refused)
//   Normed [R, D]  X's type: LayerNorm(S) * Gamma + Beta over the float32 sum S = X[i] + Skip[i] + Bias (biased
//                  variance), rounded once
//   Sum    [R, D]  X's type: S rounded once (the gathered stream, the next block's residual)
// Rows r >= live of Normed and Sum are dead, unspecified: the CPU kernel writes zeros, the CUDA kernel never writes
// them (no consumer reads a dead row).
// The kernel: raggedvit/kernels/_norm_kernel.py (CUDA, AOT) and cpu/gather_layer_norm_cpu.cc (the same function).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ragged_attention.h"  // ShapeString, ElementTypeName, CheckedMul, MakeStatus, GuardStatus, FreshSymbol

namespace raggedvit {

constexpr const char* kNormOpName = "GatherLayerNorm";
constexpr size_t kNormX = 0, kNormIndex = 1, kNormGamma = 2, kNormBeta = 3, kNormSkip = 4, kNormBias = 5,
                 kNormCu = 6, kNormNumInputs = 7;
constexpr InputSpec kNormInputs[kNormNumInputs] = {{"X", true},     {"Index", true}, {"Gamma", true},
                                                   {"Beta", true},  {"Skip", false}, {"Bias", false},
                                                   {"CuSeqlens", false}};

struct NormDims {
  int64_t T = 0, R = 0, D = 0;
  int64_t B = 0;  // CuSeqlens has B+1 entries (0 when absent)
};

// The inputs of a kernel call (ctx must outlive the returned values).
struct NormValues {
  Ort::ConstValue x{nullptr}, index{nullptr}, gamma{nullptr}, beta{nullptr}, skip{nullptr}, bias{nullptr};
  Ort::ConstValue cu{nullptr};
  std::vector<int64_t> x_shape, index_shape, gamma_shape, beta_shape, skip_shape, bias_shape, cu_shape;
  ONNXTensorElementDataType x_type = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
  ONNXTensorElementDataType index_type = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
  ONNXTensorElementDataType gamma_type = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
  ONNXTensorElementDataType beta_type = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
  ONNXTensorElementDataType skip_type = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
  ONNXTensorElementDataType bias_type = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
  ONNXTensorElementDataType cu_type = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
  bool has_skip = false, has_bias = false, has_cu = false;
};

inline OrtStatusPtr MakeNormStatus(OrtErrorCode code, const std::string& msg) {
  return MakeStatus(code, msg, kNormOpName);
}

NormValues ReadNormInputs(Ort::KernelContext& ctx);

// Checks ranks, shapes and element types of every input against X [T, D] (CuSeqlens: 1-D, at least one entry,
// int32 or int64), and that T*D, R*D (and their float byte sizes) fit int64; fills dims. "" on success, else the
// error text naming the input and the shapes.
std::string CheckNormInputs(const NormValues& v, NormDims* dims);

// live = clamp(cu[B], 0, R) (host pointer) — the CPU EP's read; the CUDA kernel clamps on the device.
template <typename I>
int64_t LiveNormRows(const I* cu, const NormDims& d) {
  const int64_t last = static_cast<int64_t>(cu[d.B]);
  return last < 0 ? 0 : (last > d.R ? d.R : last);
}

// The epsilon attribute (default 1e-5); throws on another type, a non-finite or a negative value.
float ReadNormEpsilon(const OrtKernelInfo* info);

// Shape inference: Normed and Sum are [R, D] of X's element type.
OrtStatusPtr InferGatherLayerNormShapes(OrtShapeInferContext* ctx) noexcept;

// One OrtCustomOp per (EP, data type, CuSeqlens type), as RaggedLinear: data type UNDEFINED (the CPU op) leaves the
// float inputs to the kernel's checks; a concrete type (the CUDA op: float16, bfloat16) makes ORT place other types
// elsewhere. Index is int64 either way. CuSeqlens is typed (int32, int64: one op each; the kernel checks it too):
// ORT infers UNDEFINED outputs from the last UNDEFINED input, which must stay X's type.
template <typename TKernel>
struct GatherLayerNormOp : Ort::CustomOpBase<GatherLayerNormOp<TKernel>, TKernel, /*WithStatus=*/true> {
  GatherLayerNormOp(const char* provider, ONNXTensorElementDataType data_type, ONNXTensorElementDataType cu_type)
      : provider_(provider), data_type_(data_type), cu_type_(cu_type) {
    this->InferOutputShapeFn = [](const OrtCustomOp*, OrtShapeInferContext* ctx) -> OrtStatusPtr {
      return InferGatherLayerNormShapes(ctx);
    };
  }

  OrtStatusPtr CreateKernelV2(const OrtApi&, const OrtKernelInfo* info, void** kernel) const {
    const std::string err = MissingInputError(info, kNormInputs, kNormNumInputs);
    if (!err.empty()) return MakeNormStatus(ORT_INVALID_ARGUMENT, err);
    try {
      *kernel = new TKernel(info);
    } catch (const std::exception& e) {
      return MakeNormStatus(ORT_INVALID_ARGUMENT, e.what());
    }
    return nullptr;
  }

  const char* GetName() const { return kNormOpName; }
  const char* GetExecutionProviderType() const { return provider_; }
  size_t GetInputTypeCount() const { return kNormNumInputs; }
  ONNXTensorElementDataType GetInputType(size_t i) const {
    if (i == kNormIndex) return ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64;
    return i == kNormCu ? cu_type_ : data_type_;
  }
  OrtCustomOpInputOutputCharacteristic GetInputCharacteristic(size_t) const { return InputCharacteristic(); }
  size_t GetOutputTypeCount() const { return 2; }
  ONNXTensorElementDataType GetOutputType(size_t) const { return data_type_; }
  OrtCustomOpInputOutputCharacteristic GetOutputCharacteristic(size_t) const { return INPUT_OUTPUT_REQUIRED; }

 private:
  const char* provider_;
  ONNXTensorElementDataType data_type_;
  ONNXTensorElementDataType cu_type_;
};

}  // namespace raggedvit

// com.raggedvit::GatherLayerNorm v1: argument checks and the op definition shared by the CPU and CUDA kernels. No
// CUDA here.
//
//   X      [T, D]  float | float16 (CPU EP), float16 | bfloat16 (CUDA EP): the residual stream
//   Index  [R]     int64: rows of X to gather (i < 0 counts from the end; i outside [-T, T) gives zero rows)
//   Gamma  [D]     X's type (the LayerNorm's weight)
//   Beta   [D]     X's type (the LayerNorm's bias)
//   Skip   [T, D]  X's type (optional input: the block's branch output, added to X)
//   Bias   [D]     X's type (optional input: the branch's bias, added too)
//   attribute epsilon: float (default 1e-5)
//   Normed [R, D]  X's type: LayerNorm(S) * Gamma + Beta over the float32 sum S = X[i] + Skip[i] + Bias (biased
//                  variance), rounded once
//   Sum    [R, D]  X's type: S rounded once (the gathered stream, the next block's residual)
// The kernel: raggedvit/kernels/_norm_kernel.py (CUDA, AOT) and cpu/gather_layer_norm_cpu.cc (the same function).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ragged_attention.h"  // ShapeString, ElementTypeName, CheckedMul, MakeStatus, GuardStatus, FreshSymbol

namespace raggedvit {

constexpr const char* kNormOpName = "GatherLayerNorm";
constexpr size_t kNormX = 0, kNormIndex = 1, kNormGamma = 2, kNormBeta = 3, kNormSkip = 4, kNormBias = 5,
                 kNormNumInputs = 6;

struct NormDims {
  int64_t T = 0, R = 0, D = 0;
};

// The inputs of a kernel call (ctx must outlive the returned values).
struct NormValues {
  Ort::ConstValue x{nullptr}, index{nullptr}, gamma{nullptr}, beta{nullptr}, skip{nullptr}, bias{nullptr};
  std::vector<int64_t> x_shape, index_shape, gamma_shape, beta_shape, skip_shape, bias_shape;
  ONNXTensorElementDataType x_type = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
  ONNXTensorElementDataType index_type = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
  ONNXTensorElementDataType gamma_type = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
  ONNXTensorElementDataType beta_type = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
  ONNXTensorElementDataType skip_type = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
  ONNXTensorElementDataType bias_type = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
  bool has_skip = false, has_bias = false;
};

inline OrtStatusPtr MakeNormStatus(OrtErrorCode code, const std::string& msg) {
  return MakeStatus(code, msg, kNormOpName);
}

NormValues ReadNormInputs(Ort::KernelContext& ctx);

// Checks ranks, shapes and element types of every input against X [T, D], and that T*D, R*D (and their float
// byte sizes) fit int64; fills dims. "" on success, else the error text naming the input and the shapes.
std::string CheckNormInputs(const NormValues& v, NormDims* dims);

// The epsilon attribute (default 1e-5); throws on a non-finite or negative value.
float ReadNormEpsilon(const OrtKernelInfo* info);

// Shape inference: Normed and Sum are [R, D] of X's element type.
OrtStatusPtr InferGatherLayerNormShapes(OrtShapeInferContext* ctx) noexcept;

// One OrtCustomOp per (EP, data type): UNDEFINED (the CPU op) leaves the types to the kernel's checks; a concrete
// type (the CUDA op: float16, bfloat16) makes ORT place other types elsewhere. Index is int64 either way.
template <typename TKernel>
struct GatherLayerNormOp : Ort::CustomOpBase<GatherLayerNormOp<TKernel>, TKernel, /*WithStatus=*/true> {
  GatherLayerNormOp(const char* provider, ONNXTensorElementDataType data_type)
      : provider_(provider), data_type_(data_type) {
    this->InferOutputShapeFn = [](const OrtCustomOp*, OrtShapeInferContext* ctx) -> OrtStatusPtr {
      return InferGatherLayerNormShapes(ctx);
    };
  }

  OrtStatusPtr CreateKernelV2(const OrtApi&, const OrtKernelInfo* info, void** kernel) const {
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
    return i == kNormIndex ? ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64 : data_type_;
  }
  OrtCustomOpInputOutputCharacteristic GetInputCharacteristic(size_t i) const {
    return i >= kNormSkip ? INPUT_OUTPUT_OPTIONAL : INPUT_OUTPUT_REQUIRED;
  }
  size_t GetOutputTypeCount() const { return 2; }
  ONNXTensorElementDataType GetOutputType(size_t) const { return data_type_; }
  OrtCustomOpInputOutputCharacteristic GetOutputCharacteristic(size_t) const { return INPUT_OUTPUT_REQUIRED; }

 private:
  const char* provider_;
  ONNXTensorElementDataType data_type_;
};

}  // namespace raggedvit

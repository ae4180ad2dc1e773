// com.raggedvit::BiasGelu v1: argument checks and the op definition shared by the CPU and CUDA kernels. No CUDA
// here.
//
//   X    [..., N]  float | float16 (CPU EP), float16 | bfloat16 (CUDA EP); rank >= 1
//   Bias [N]       X's type (optional input)
//   Y    X's shape and type: Y = GELU(X + Bias) = s * erfc(-s / sqrt 2) / 2 with s = X + Bias, the sum and GELU in
//        float32, one rounding (2e-6 relative for s >= -4, growing as s^2 below; CPU: std::erfc, CUDA:
//        raggedvit/kernels/_linear_kernel.py gelu_erf)
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ragged_attention.h"  // ShapeString, ElementTypeName, CheckedMul, MakeStatus, GuardStatus, FreshSymbol

namespace raggedvit {

constexpr const char* kGeluOpName = "BiasGelu";
constexpr size_t kGeluX = 0, kGeluBias = 1, kGeluNumInputs = 2;
constexpr InputSpec kGeluInputs[kGeluNumInputs] = {{"X", true}, {"Bias", false}};

struct GeluDims {
  int64_t M = 0, N = 0;  // X as [M, N] (M = product of the leading dims)
};

// The inputs of a kernel call (ctx must outlive the returned values).
struct GeluValues {
  Ort::ConstValue x{nullptr}, bias{nullptr};
  std::vector<int64_t> x_shape, bias_shape;
  ONNXTensorElementDataType x_type = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
  ONNXTensorElementDataType bias_type = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
  bool has_bias = false;
};

inline OrtStatusPtr MakeGeluStatus(OrtErrorCode code, const std::string& msg) {
  return MakeStatus(code, msg, kGeluOpName);
}

GeluValues ReadGeluInputs(Ort::KernelContext& ctx);

// Checks X's rank, Bias's shape and type, and that X's element count (and its float byte size) fits int64;
// fills dims. "" on success, else the error text naming the input and the shapes.
std::string CheckGeluInputs(const GeluValues& v, GeluDims* dims);

// Shape inference: Y has X's shape and element type.
OrtStatusPtr InferBiasGeluShapes(OrtShapeInferContext* ctx) noexcept;

// One OrtCustomOp per (EP, data type): UNDEFINED (the CPU op) leaves the types to the kernel's checks; a concrete
// type (the CUDA op: float16, bfloat16) makes ORT place other types elsewhere.
template <typename TKernel>
struct BiasGeluOp : Ort::CustomOpBase<BiasGeluOp<TKernel>, TKernel, /*WithStatus=*/true> {
  BiasGeluOp(const char* provider, ONNXTensorElementDataType data_type) : provider_(provider), data_type_(data_type) {
    this->InferOutputShapeFn = [](const OrtCustomOp*, OrtShapeInferContext* ctx) -> OrtStatusPtr {
      return InferBiasGeluShapes(ctx);
    };
  }

  OrtStatusPtr CreateKernelV2(const OrtApi&, const OrtKernelInfo* info, void** kernel) const {
    const std::string err = MissingInputError(info, kGeluInputs, kGeluNumInputs);
    if (!err.empty()) return MakeGeluStatus(ORT_INVALID_ARGUMENT, err);
    try {
      *kernel = new TKernel(info);
    } catch (const std::exception& e) {
      return MakeGeluStatus(ORT_FAIL, e.what());
    }
    return nullptr;
  }

  const char* GetName() const { return kGeluOpName; }
  const char* GetExecutionProviderType() const { return provider_; }
  size_t GetInputTypeCount() const { return kGeluNumInputs; }
  ONNXTensorElementDataType GetInputType(size_t) const { return data_type_; }
  OrtCustomOpInputOutputCharacteristic GetInputCharacteristic(size_t) const { return InputCharacteristic(); }
  size_t GetOutputTypeCount() const { return 1; }
  ONNXTensorElementDataType GetOutputType(size_t) const { return data_type_; }
  OrtCustomOpInputOutputCharacteristic GetOutputCharacteristic(size_t) const { return INPUT_OUTPUT_REQUIRED; }

 private:
  const char* provider_;
  ONNXTensorElementDataType data_type_;
};

}  // namespace raggedvit

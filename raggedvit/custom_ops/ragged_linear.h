// com.raggedvit::RaggedLinear v1: attribute, argument checks and the op definition shared by the CPU and CUDA
// kernels. No CUDA here.
//
//   X         [T, K]  float | float16 (CPU EP), float16 | bfloat16 (CUDA EP)
//   W         [N, K]  X's type (nn.Linear's weight layout, not transposed)
//   Bias      [N]     X's type (optional input)
//   Residual  [T, N]  X's type (optional input)
//   CuSeqlens [B+1]   int32 | int64, B >= 0 (optional input): live = clamp(CuSeqlens[B], 0, T), else live = T
//   Y         [T, N]  X's type: Y[r] = act(X[r] W^T + Bias) + Residual[r] for r < live (fp32 accumulation, one
//                     rounding); rows r >= live are dead, unspecified: the CPU kernel writes zeros, the CUDA
//                     kernels write none past the last live tile (the sm_90 TMA kernel stores whole tiles; no
//                     consumer reads a dead row)
//   attribute activation (int, default 0): 0 none, 1 GELU (exact, erf)
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ragged_attention.h"  // ShapeString, ElementTypeName, CheckedMul, MakeStatus, GuardStatus, FreshSymbol

namespace raggedvit {

constexpr const char* kLinearOpName = "RaggedLinear";

// Input positions.
constexpr size_t kLinearX = 0, kLinearW = 1, kLinearBias = 2, kLinearResidual = 3, kLinearCu = 4,
                 kLinearNumInputs = 5;
constexpr InputSpec kLinearInputs[kLinearNumInputs] = {
    {"X", true}, {"W", true}, {"Bias", false}, {"Residual", false}, {"CuSeqlens", false}};

struct LinearAttrs {
  int64_t activation = 0;  // 0 none, 1 GELU (erf)
};

struct LinearDims {
  int64_t T = 0, N = 0, K = 0;
  int64_t B = 0;  // CuSeqlens has B+1 entries (0 when absent)
};

// Shapes and element types of the inputs of one call (present = false: the optional input is absent).
struct LinearInputs {
  std::vector<int64_t> x, w, bias, residual, cu;
  ONNXTensorElementDataType x_type = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
  ONNXTensorElementDataType w_type = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
  ONNXTensorElementDataType bias_type = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
  ONNXTensorElementDataType residual_type = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
  ONNXTensorElementDataType cu_type = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
  bool has_bias = false, has_residual = false, has_cu = false;
};

// The inputs of a kernel call (ctx must outlive the returned values).
struct LinearValues {
  Ort::ConstValue x{nullptr}, w{nullptr}, bias{nullptr}, residual{nullptr}, cu{nullptr};
  LinearInputs info;
};

inline OrtStatusPtr MakeLinearStatus(OrtErrorCode code, const std::string& msg) {
  return MakeStatus(code, msg, kLinearOpName);
}

// Reads and checks the attribute; "" on success, else the error text.
std::string ReadLinearAttrs(const OrtKernelInfo* info, LinearAttrs* attrs);

// Reads the inputs of a call (absent optional inputs stay null).
LinearValues ReadLinearInputs(Ort::KernelContext& ctx);

// Checks ranks, sizes, K match, optional shapes and that every float input has X's type (EP-independent); fills
// dims. "" on success, else the error text naming the input and the shapes. Every element count T*K, N*K, T*N is
// checked against int64 overflow.
std::string CheckLinearInputs(const LinearInputs& in, LinearDims* dims);

// live = clamp(cu[B], 0, T) (host pointer) — the CPU EP's read; the CUDA kernel clamps on the device.
template <typename I>
int64_t LiveRows(const I* cu, const LinearDims& d) {
  const int64_t last = static_cast<int64_t>(cu[d.B]);
  return last < 0 ? 0 : (last > d.T ? d.T : last);
}

// Shape inference shared by every registration: Y [T, N] of X's element type.
OrtStatusPtr InferRaggedLinearShapes(OrtShapeInferContext* ctx) noexcept;

// One OrtCustomOp per (EP, data type, CuSeqlens type). data_type UNDEFINED (the CPU op) leaves the float inputs
// to the kernel's own checks; a concrete type (the CUDA op: float16, bfloat16) makes ORT place other types
// elsewhere (float nodes run on the CPU EP).
template <typename TKernel>
struct RaggedLinearOp : Ort::CustomOpBase<RaggedLinearOp<TKernel>, TKernel, /*WithStatus=*/true> {
  RaggedLinearOp(const char* provider, ONNXTensorElementDataType data_type, ONNXTensorElementDataType cu_type)
      : provider_(provider), data_type_(data_type), cu_type_(cu_type) {
    this->InferOutputShapeFn = [](const OrtCustomOp*, OrtShapeInferContext* ctx) -> OrtStatusPtr {
      return InferRaggedLinearShapes(ctx);
    };
  }

  OrtStatusPtr CreateKernelV2(const OrtApi&, const OrtKernelInfo* info, void** kernel) const {
    std::string err = MissingInputError(info, kLinearInputs, kLinearNumInputs);
    if (!err.empty()) return MakeLinearStatus(ORT_INVALID_ARGUMENT, err);
    LinearAttrs attrs;
    err = ReadLinearAttrs(info, &attrs);
    if (!err.empty()) return MakeLinearStatus(ORT_INVALID_ARGUMENT, err);
    try {
      *kernel = new TKernel(attrs, info);
    } catch (const std::exception& e) {
      return MakeLinearStatus(ORT_FAIL, e.what());
    }
    return nullptr;
  }

  const char* GetName() const { return kLinearOpName; }
  const char* GetExecutionProviderType() const { return provider_; }
  size_t GetInputTypeCount() const { return kLinearNumInputs; }
  ONNXTensorElementDataType GetInputType(size_t i) const { return i == kLinearCu ? cu_type_ : data_type_; }
  OrtCustomOpInputOutputCharacteristic GetInputCharacteristic(size_t) const { return InputCharacteristic(); }
  size_t GetOutputTypeCount() const { return 1; }
  ONNXTensorElementDataType GetOutputType(size_t) const { return data_type_; }
  OrtCustomOpInputOutputCharacteristic GetOutputCharacteristic(size_t) const { return INPUT_OUTPUT_REQUIRED; }

 private:
  const char* provider_;
  ONNXTensorElementDataType data_type_;
  ONNXTensorElementDataType cu_type_;
};

}  // namespace raggedvit

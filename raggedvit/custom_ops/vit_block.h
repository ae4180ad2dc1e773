// com.raggedvit::RaggedViTBlock v1: one whole pre-norm ViT block on packed rows (timm's Block with Attention, Mlp
// and optional LayerScale): attributes, argument checks and the op definition shared by the kernels. No CUDA here.
//
//   x            [T, C]    S = float | float16 (CPU EP): the residual stream; rows >= cu_seqlens[B] are dead
//   cu_seqlens   [B+1]     int32 | int64, 0 = cu[0] <= ... <= cu[B] <= T
//   norm1_weight [C], norm1_bias [C]           S
//   qkv_weight   [3C, C],  qkv_bias [3C]?      G = float | float16 (the GEMM type)
//   proj_weight  [C, C],   proj_bias [C]?      G
//   norm2_weight [C], norm2_bias [C]           S
//   fc1_weight   [F, C],   fc1_bias [F]?       G
//   fc2_weight   [C, F],   fc2_bias [C]?       G
//   ls1 [C]?, ls2 [C]?                         S (LayerScale gammas)
//   y            [T, C]    S: x1 + ls2 * fc2(GELU(fc1(LN2(x1)))), x1 = x + ls1 * proj(attention(qkv(LN1(x))));
//                          zeros on the dead rows (raggedvit.kernels.reference.vit_block_reference)
//   cls_attn     [T]       float (optional output): mean over heads of each sequence's first row's attention
//   attributes num_heads (int, divides C), epsilon (float, both LayerNorms), scale (float, softmax scale)
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ragged_attention.h"  // ShapeString, ElementTypeName, CheckedMul, MakeStatus, GuardStatus, FreshSymbol

namespace raggedvit {

constexpr const char* kBlockOpName = "RaggedViTBlock";

// Input positions (the weights in BlockWeights' order).
enum BlockInput : size_t {
  kBlockX = 0, kBlockCu, kNorm1Weight, kNorm1Bias, kQkvWeight, kQkvBias, kProjWeight, kProjBias, kNorm2Weight,
  kNorm2Bias, kFc1Weight, kFc1Bias, kFc2Weight, kFc2Bias, kLs1, kLs2, kBlockNumInputs
};

// The inputs' names, as the exporter's schema spells them (error messages name them).
extern const char* const kBlockInputNames[kBlockNumInputs];

// Whether input i may be absent (the biases of the four Linear layers and the LayerScales).
constexpr bool BlockInputOptional(size_t i) {
  return i == kQkvBias || i == kProjBias || i == kFc1Bias || i == kFc2Bias || i == kLs1 || i == kLs2;
}

// Whether input i is of the stream type S (x, the norms, the LayerScales) rather than the GEMM type.
constexpr bool BlockInputIsStream(size_t i) {
  return i == kBlockX || i == kNorm1Weight || i == kNorm1Bias || i == kNorm2Weight || i == kNorm2Bias || i == kLs1 ||
         i == kLs2;
}

struct BlockAttrs {
  int64_t num_heads = 0;
  float epsilon = 0.0f;
  float scale = 0.0f;
};

struct BlockDims {
  int64_t T = 0, C = 0, F = 0, B = 0, H = 0;
};

// Shapes and element types of the inputs of one call (present[i] = false: optional input i is absent).
struct BlockInputs {
  std::vector<int64_t> shape[kBlockNumInputs];
  ONNXTensorElementDataType type[kBlockNumInputs] = {};
  bool present[kBlockNumInputs] = {};
};

// The inputs of a kernel call (ctx must outlive the returned values).
struct BlockValues {
  Ort::ConstValue value[kBlockNumInputs];
  BlockInputs info;
};

inline OrtStatusPtr MakeBlockStatus(OrtErrorCode code, const std::string& msg) {
  return MakeStatus(code, msg, kBlockOpName);
}

// The op's one attribute reader: num_heads (int >= 1), epsilon (finite float >= 0), scale (finite float), all
// required, each of its own type. "" on success, else the error text naming the attribute.
std::string ReadBlockAttrs(const OrtKernelInfo* info, BlockAttrs* attrs);

// Reads the inputs of a call (absent optional inputs stay null).
BlockValues ReadBlockInputs(Ort::KernelContext& ctx);

// Checks every rank and size against x [T, C] and fc1_weight [F, C], the element types (S for x, the norms and
// the LayerScales, one G for the Linear weights and biases, int32 / int64 cu_seqlens), that num_heads divides C,
// and every element count the kernels allocate (T*3C, T*F, F*C, 3C*C) against int64 byte overflow; fills dims.
// "" on success, else the error text naming the input and the shapes.
std::string CheckBlockInputs(const BlockInputs& in, const BlockAttrs& attrs, BlockDims* dims);

// Shape inference shared by every registration: y [T, C] of x's element type.
OrtStatusPtr InferRaggedViTBlockShapes(OrtShapeInferContext* ctx) noexcept;

// One OrtCustomOp per (EP, stream type, cu_seqlens type[, GEMM type]): x and y are of the stream type (so ORT
// infers y's type from the registration x matches); without a GEMM type the weights are declared UNDEFINED (each
// its own type constraint: the stream and GEMM types may differ) and checked by the kernel (CheckBlockInputs).
template <typename TKernel>
struct RaggedViTBlockOp : Ort::CustomOpBase<RaggedViTBlockOp<TKernel>, TKernel, /*WithStatus=*/true> {
  // gemm_type UNDEFINED: the weights are of any type (checked by the kernel); else the Linear weights and biases
  // are declared gemm_type and the norms and LayerScales the stream type, so ORT places only such nodes here.
  RaggedViTBlockOp(const char* provider, ONNXTensorElementDataType stream_type, ONNXTensorElementDataType cu_type,
                   ONNXTensorElementDataType gemm_type = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED)
      : provider_(provider), stream_type_(stream_type), cu_type_(cu_type), gemm_type_(gemm_type) {
    this->InferOutputShapeFn = [](const OrtCustomOp*, OrtShapeInferContext* ctx) -> OrtStatusPtr {
      return InferRaggedViTBlockShapes(ctx);
    };
  }

  OrtStatusPtr CreateKernelV2(const OrtApi&, const OrtKernelInfo* info, void** kernel) const {
    BlockAttrs attrs;
    std::string err = ReadBlockAttrs(info, &attrs);
    if (!err.empty()) return MakeBlockStatus(ORT_INVALID_ARGUMENT, err);
    try {
      *kernel = new TKernel(attrs, info);
    } catch (const std::exception& e) {
      return MakeBlockStatus(ORT_FAIL, e.what());
    }
    return nullptr;
  }

  const char* GetName() const { return kBlockOpName; }
  const char* GetExecutionProviderType() const { return provider_; }
  size_t GetInputTypeCount() const { return kBlockNumInputs; }
  ONNXTensorElementDataType GetInputType(size_t i) const {
    if (i == kBlockX) return stream_type_;
    if (i == kBlockCu) return cu_type_;
    if (gemm_type_ == ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED) return gemm_type_;
    return BlockInputIsStream(i) ? stream_type_ : gemm_type_;
  }
  OrtCustomOpInputOutputCharacteristic GetInputCharacteristic(size_t i) const {
    return BlockInputOptional(i) ? INPUT_OUTPUT_OPTIONAL : INPUT_OUTPUT_REQUIRED;
  }
  size_t GetOutputTypeCount() const { return 2; }
  ONNXTensorElementDataType GetOutputType(size_t i) const {
    return i == 0 ? stream_type_ : ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
  }
  OrtCustomOpInputOutputCharacteristic GetOutputCharacteristic(size_t i) const {
    return i == 0 ? INPUT_OUTPUT_REQUIRED : INPUT_OUTPUT_OPTIONAL;
  }

 private:
  const char* provider_;
  ONNXTensorElementDataType stream_type_;
  ONNXTensorElementDataType cu_type_;
  ONNXTensorElementDataType gemm_type_;
};

}  // namespace raggedvit

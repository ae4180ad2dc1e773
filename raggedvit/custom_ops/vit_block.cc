// Attribute reading, argument checks and shape inference of RaggedViTBlock (shared by every EP).
#include "vit_block.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

namespace raggedvit {

const char* const kBlockInputNames[kBlockNumInputs] = {
    "x",          "cu_seqlens", "norm1_weight", "norm1_bias", "qkv_weight", "qkv_bias",
    "proj_weight", "proj_bias", "norm2_weight", "norm2_bias", "fc1_weight", "fc1_bias",
    "fc2_weight", "fc2_bias",   "ls1",          "ls2"};

namespace {

// Element count a*b and its float byte size, both fitting int64 (op_checks.h's CheckedSize).
bool FitsBytes(int64_t a, int64_t b) { return CheckedSize({a, b}, static_cast<int64_t>(sizeof(float))); }

bool IsFloatType(ONNXTensorElementDataType t) {
  return t == ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT || t == ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16 ||
         t == ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16;
}

}  // namespace

std::string ReadBlockAttrs(const OrtKernelInfo* info, BlockAttrs* attrs) {
  constexpr float kMax = std::numeric_limits<float>::max();
  std::string err = ReadIntAttr(info, "num_heads", 1, std::numeric_limits<int64_t>::max(), &attrs->num_heads,
                                /*required=*/true);
  if (err.empty()) err = ReadFloatAttr(info, "epsilon", 0.0f, kMax, &attrs->epsilon, false, false, /*required=*/true);
  if (err.empty()) err = ReadFloatAttr(info, "scale", -kMax, kMax, &attrs->scale, false, false, /*required=*/true);
  return err;
}

BlockValues ReadBlockInputs(Ort::KernelContext& ctx) {
  BlockValues v;
  const size_t n = ctx.GetInputCount();
  for (size_t i = 0; i < kBlockNumInputs && i < n; ++i) {
    v.value[i] = ctx.GetInput(i);
    v.info.present[i] = static_cast<bool>(v.value[i]);
    if (v.info.present[i]) {
      auto info = v.value[i].GetTensorTypeAndShapeInfo();
      v.info.shape[i] = info.GetShape();
      v.info.type[i] = info.GetElementType();
    }
  }
  return v;
}

std::string CheckBlockInputs(const BlockInputs& in, const BlockAttrs& attrs, BlockDims* dims) {
  for (size_t i = 0; i < kBlockNumInputs; ++i) {
    if (!in.present[i] && !BlockInputOptional(i)) return std::string("input '") + kBlockInputNames[i] + "' is required";
  }
  const std::vector<int64_t>& x = in.shape[kBlockX];
  if (x.size() != 2 || x[0] < 0 || x[1] < 1) return "input 'x' must be 2-D [T, C] with C >= 1, got shape " + ShapeString(x);
  const int64_t T = x[0], C = x[1];
  const std::vector<int64_t>& fc1 = in.shape[kFc1Weight];
  const std::string where = " (x shape " + ShapeString(x) + ", fc1_weight shape " + ShapeString(fc1) +
                            ", num_heads = " + std::to_string(attrs.num_heads) + ")";
  if (fc1.size() != 2 || fc1[0] < 0 || fc1[1] != C) {
    return "input 'fc1_weight' must be 2-D [F, C] with C = " + std::to_string(C) + where;
  }
  const int64_t F = fc1[0];
  int64_t three_c = 0;
  if (!CheckedMul(3, C, &three_c) || !FitsBytes(T, three_c) || !FitsBytes(three_c, C) || !FitsBytes(T, F) ||
      !FitsBytes(F, C)) {
    return "T*3C, 3C*C, T*F or F*C elements overflow int64 bytes" + where;
  }
  if (F < 1) return "input 'fc1_weight' must have F >= 1 rows" + where;
  if (C % attrs.num_heads != 0) return "attribute 'num_heads' must divide C = " + std::to_string(C) + where;
  const std::vector<int64_t>& cu = in.shape[kBlockCu];
  if (cu.size() != 1 || cu[0] < 1) return "input 'cu_seqlens' must be 1-D [B+1] with B >= 0, got shape " + ShapeString(cu) + where;
  if (cu[0] == 1 && T > 0) {
    return "input 'cu_seqlens' (shape " + ShapeString(cu) + ") describes B = 0 sequences but x has T = " +
           std::to_string(T) + " rows" + where;
  }
  if (in.type[kBlockCu] != ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32 && in.type[kBlockCu] != ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64) {
    return std::string("input 'cu_seqlens' (shape ") + ShapeString(cu) + ") must be int32 or int64, got " +
           ElementTypeName(in.type[kBlockCu]);
  }
  const ONNXTensorElementDataType S = in.type[kBlockX], G = in.type[kQkvWeight];
  if (!IsFloatType(S)) return std::string("input 'x' (shape ") + ShapeString(x) + ") must be a float type, got " + ElementTypeName(S);
  if (!IsFloatType(G)) {
    return std::string("input 'qkv_weight' (shape ") + ShapeString(in.shape[kQkvWeight]) +
           ") must be a float type, got " + ElementTypeName(G);
  }
  const std::vector<int64_t> expect[kBlockNumInputs] = {
      x, cu, {C}, {C}, {three_c, C}, {three_c}, {C, C}, {C}, {C}, {C}, {F, C}, {F}, {C, F}, {C}, {C}, {C}};
  for (size_t i = kNorm1Weight; i < kBlockNumInputs; ++i) {
    if (!in.present[i]) continue;
    const bool stream = BlockInputIsStream(i);
    const std::string name = kBlockInputNames[i];
    if (in.shape[i] != expect[i]) {
      return "input '" + name + "' must be " + ShapeString(expect[i]) + ", got shape " + ShapeString(in.shape[i]) + where;
    }
    const ONNXTensorElementDataType want = stream ? S : G;
    if (in.type[i] != want) {
      return "input '" + name + "' (shape " + ShapeString(in.shape[i]) + ") has element type " +
             ElementTypeName(in.type[i]) + ", " + (stream ? "x" : "qkv_weight") + " has " + ElementTypeName(want) +
             where;
    }
  }
  dims->T = T;
  dims->C = C;
  dims->F = F;
  dims->B = cu[0] - 1;
  dims->H = attrs.num_heads;
  return "";
}

OrtStatusPtr InferRaggedViTBlockShapes(OrtShapeInferContext* raw) noexcept {
  return GuardStatus(
      [&]() -> OrtStatusPtr {
        Ort::ShapeInferContext ctx(&Ort::GetApi(), raw);
        if (ctx.GetInputCount() < 1) return nullptr;
        OrtTensorTypeAndShapeInfo* raw_info = nullptr;  // owned by ORT
        Ort::ThrowOnError(Ort::GetApi().ShapeInferContext_GetInputTypeShape(raw, kBlockX, &raw_info));
        ONNXTensorElementDataType x_type = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
        Ort::ThrowOnError(Ort::GetApi().GetTensorElementType(raw_info, &x_type));
        const auto& x = ctx.GetInputShape(kBlockX);
        if (x.size() != 2) return nullptr;  // the kernel reports the rank
        // unknown dims reach us as -1 without a symbol: give them a fresh symbol (see InferRaggedAttentionShapes)
        Ort::ShapeInferContext::Shape y;
        for (const auto& d : x) y.push_back(d.IsInt() && d.AsInt() < 0 ? FreshSymbol() : d);
        Ort::Status st = ctx.SetOutputShape(0, y, x_type);
        return st.IsOK() ? nullptr : st.release();
      },
      kBlockOpName);
}

}  // namespace raggedvit

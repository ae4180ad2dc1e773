// Attribute reading, shape checks and shape inference of RaggedAttention (shared by every EP).
#include "ragged_attention.h"

#include <deque>
#include <mutex>
#include <sstream>
#include <string>
#include <utility>

namespace raggedvit {

std::string ShapeString(const std::vector<int64_t>& shape) {
  std::ostringstream s;
  s << "[";
  for (size_t i = 0; i < shape.size(); ++i) s << (i ? ", " : "") << shape[i];
  s << "]";
  return s.str();
}

const char* ElementTypeName(ONNXTensorElementDataType type) {
  switch (type) {
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT: return "float";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16: return "float16";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16: return "bfloat16";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_DOUBLE: return "double";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32: return "int32";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64: return "int64";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8: return "int8";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8: return "uint8";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_BOOL: return "bool";
    default: return "a non-floating-point type";
  }
}

std::string ReadAttrs(const OrtKernelInfo* info, Attrs* attrs) {
  // num_heads <= kMaxNumHeads: 3*num_heads (the qkv width per head dim) fits int64
  std::string err = ReadIntAttr(info, "num_heads", 1, kMaxNumHeads, &attrs->num_heads, /*required=*/true);
  if (err.empty()) err = ReadFloatAttr(info, "scale", -kFloatMax, kFloatMax, &attrs->scale);
  if (err.empty()) err = ReadIntAttr(info, "max_seqlen", 0, kInt64Max, &attrs->max_seqlen);
  if (err.empty()) err = ReadIntAttr(info, "grid_h", 0, kInt64Max, &attrs->grid_h);
  if (err.empty()) err = ReadIntAttr(info, "grid_w", 0, kInt64Max, &attrs->grid_w);
  if (err.empty()) err = ReadIntAttr(info, "num_prefix", 0, kInt64Max, &attrs->num_prefix);
  if (!err.empty()) return err;
  attrs->has_scale = std::string(AttrTypeName(info, "scale")) == "float";
  if (attrs->grid_h > 0 && attrs->grid_w > 0) {
    // R = (2*grid_h-1)*(2*grid_w-1) + 3 and num_prefix + grid_h*grid_w, each step checked
    int64_t h2 = 0, w2 = 0, r = 0, area = 0, end = 0;
    const bool ok = CheckedMul(2, attrs->grid_h, &h2) && CheckedMul(2, attrs->grid_w, &w2) &&
                    CheckedMul(h2 - 1, w2 - 1, &r) && CheckedAdd(r, 3, &r) &&
                    CheckedMul(attrs->grid_h, attrs->grid_w, &area) && CheckedAdd(area, attrs->num_prefix, &end);
    if (!ok) {
      return "attributes grid_h = " + std::to_string(attrs->grid_h) + ", grid_w = " + std::to_string(attrs->grid_w) +
             ", num_prefix = " + std::to_string(attrs->num_prefix) +
             ": (2*grid_h-1)*(2*grid_w-1)+3 or num_prefix + grid_h*grid_w overflows int64";
    }
    attrs->pos_size = r;
    attrs->patch_end = end;
  }
  return "";
}

std::string CheckPos(bool has_table, const std::vector<int64_t>& table_shape, ONNXTensorElementDataType table_type,
                     bool has_token_pos, const std::vector<int64_t>& token_pos_shape,
                     ONNXTensorElementDataType token_pos_type, ONNXTensorElementDataType cu_type,
                     const std::vector<int64_t>& qkv_shape, const Attrs& attrs) {
  if (!has_table && !has_token_pos) return "";
  const std::string where = " (qkv shape " + ShapeString(qkv_shape) + ", num_heads = " +
                            std::to_string(attrs.num_heads) + ", grid_h = " + std::to_string(attrs.grid_h) +
                            ", grid_w = " + std::to_string(attrs.grid_w) + ")";
  if (has_table != has_token_pos) {
    return std::string("input '") + (has_table ? "pos_table" : "token_pos") + "' needs input '" +
           (has_table ? "token_pos" : "pos_table") + "' too" + where;
  }
  if (attrs.pos_size == 0) {
    return "attributes 'grid_h' and 'grid_w' must be >= 1 with input 'pos_table'" + where;
  }
  if (table_shape.size() != 2 || table_shape[0] != attrs.num_heads || table_shape[1] != attrs.pos_size) {
    return "input 'pos_table' must be [num_heads, (2*grid_h-1)*(2*grid_w-1)+3] = [" + std::to_string(attrs.num_heads) +
           ", " + std::to_string(attrs.pos_size) + "], got shape " + ShapeString(table_shape) + where;
  }
  if (table_type != ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT) {
    return std::string("input 'pos_table' (shape ") + ShapeString(table_shape) + ") must be float, got " +
           ElementTypeName(table_type) + where;
  }
  const int64_t T = qkv_shape.empty() ? -1 : qkv_shape[0];
  if (token_pos_shape.size() != 1 || token_pos_shape[0] != T) {
    return "input 'token_pos' must be 1-D [" + std::to_string(T) + "] (one entry per qkv row), got shape " +
           ShapeString(token_pos_shape) + where;
  }
  if (token_pos_type != cu_type) {
    return std::string("input 'token_pos' (shape ") + ShapeString(token_pos_shape) + ") must have cu_seqlens's " +
           "element type (int32 or int64, both the same; cu_seqlens is " + ElementTypeName(cu_type) + "), got " +
           ElementTypeName(token_pos_type) + where;
  }
  return "";
}

std::string CheckShapes(const std::vector<int64_t>& qkv_shape, const std::vector<int64_t>& cu_shape,
                        int64_t num_heads, Dims* dims) {
  const std::string shapes = "(qkv shape " + ShapeString(qkv_shape) + ", cu_seqlens shape " +
                             ShapeString(cu_shape) + ", num_heads = " + std::to_string(num_heads) + ")";
  if (qkv_shape.size() != 2) {
    return "input 'qkv' must be 2-D [T, 3*num_heads*head_dim], got rank " + std::to_string(qkv_shape.size()) +
           " " + shapes;
  }
  int64_t three_h = 0;
  if (num_heads <= 0 || !CheckedMul(3, num_heads, &three_h)) {
    return "attribute 'num_heads' must be in [1, " + std::to_string(kMaxNumHeads) + "] " + shapes;
  }
  const int64_t T = qkv_shape[0], W = qkv_shape[1];
  if (T < 0) return "input 'qkv' has a negative row count T = " + std::to_string(T) + " " + shapes;
  if (W <= 0 || W % three_h != 0) {
    return "input 'qkv' width " + std::to_string(W) + " must be a positive multiple of 3*num_heads = " +
           std::to_string(three_h) + " " + shapes;
  }
  // T*W elements (every row offset t*W and out's T*H*D stay below it) and their float bytes fit int64
  if (!CheckedSize({T, W}, static_cast<int64_t>(sizeof(float)))) {
    return "input 'qkv' holds T*W = " + std::to_string(T) + "*" + std::to_string(W) + " elements, which overflows " +
           "int64 " + shapes;
  }
  if (cu_shape.size() != 1) {
    return "input 'cu_seqlens' must be 1-D [B+1], got rank " + std::to_string(cu_shape.size()) + " " + shapes;
  }
  if (cu_shape[0] < 1) {
    return "input 'cu_seqlens' must hold B+1 >= 1 offsets, got length " + std::to_string(cu_shape[0]) + " " +
           shapes;
  }
  const int64_t B = cu_shape[0] - 1;
  if (B == 0 && T > 0) {
    return "input 'cu_seqlens' describes B = 0 sequences but input 'qkv' has T = " + std::to_string(T) +
           " rows " + shapes;
  }
  dims->T = T;
  dims->B = B;
  dims->H = num_heads;
  dims->D = W / three_h;  // >= 1: W is a positive multiple of 3*H
  return "";
}

std::string ReadPosInputs(Ort::KernelContext& ctx, const Attrs& attrs, const std::vector<int64_t>& qkv_shape,
                          ONNXTensorElementDataType cu_type, const void** table, const void** token_pos) {
  *table = *token_pos = nullptr;
  const size_t n = ctx.GetInputCount();
  Ort::ConstValue t = n > kPosTableInput ? ctx.GetInput(kPosTableInput) : Ort::ConstValue{nullptr};
  Ort::ConstValue p = n > kTokenPosInput ? ctx.GetInput(kTokenPosInput) : Ort::ConstValue{nullptr};
  if (!t && !p) return "";
  std::vector<int64_t> t_shape, p_shape;
  auto t_type = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED, p_type = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
  if (t) {
    auto info = t.GetTensorTypeAndShapeInfo();
    t_shape = info.GetShape();
    t_type = info.GetElementType();
  }
  if (p) {
    auto info = p.GetTensorTypeAndShapeInfo();
    p_shape = info.GetShape();
    p_type = info.GetElementType();
  }
  std::string err = CheckPos(static_cast<bool>(t), t_shape, t_type, static_cast<bool>(p), p_shape, p_type, cu_type,
                             qkv_shape, attrs);
  if (!err.empty()) return err;
  *table = t.GetTensorRawData();
  *token_pos = p.GetTensorRawData();
  return "";
}

std::string CheckKeyBias(const std::vector<int64_t>& key_bias_shape, ONNXTensorElementDataType key_bias_type,
                         const std::vector<int64_t>& qkv_shape) {
  const int64_t T = qkv_shape.empty() ? -1 : qkv_shape[0];
  if (key_bias_shape.size() != 1 || key_bias_shape[0] != T) {
    return "input 'key_bias' must be 1-D [" + std::to_string(T) + "] (one entry per qkv row, qkv shape " +
           ShapeString(qkv_shape) + "), got shape " + ShapeString(key_bias_shape);
  }
  if (key_bias_type != ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT) {
    return std::string("input 'key_bias' (shape ") + ShapeString(key_bias_shape) + ") must be float, got " +
           ElementTypeName(key_bias_type) + " (qkv shape " + ShapeString(qkv_shape) + ")";
  }
  return "";
}

std::string ReadKeyBias(Ort::KernelContext& ctx, const std::vector<int64_t>& qkv_shape, const float** key_bias) {
  *key_bias = nullptr;
  if (ctx.GetInputCount() <= kKeyBiasInput) return "";
  Ort::ConstValue kb = ctx.GetInput(kKeyBiasInput);
  if (!kb) return "";
  auto info = kb.GetTensorTypeAndShapeInfo();
  std::string err = CheckKeyBias(info.GetShape(), info.GetElementType(), qkv_shape);
  if (!err.empty()) return err;
  *key_bias = static_cast<const float*>(kb.GetTensorRawData());
  return "";
}

Ort::ShapeInferContext::SymbolicInteger FreshSymbol() {
  static std::mutex mu;
  static std::deque<std::string> names;
  std::lock_guard<std::mutex> lock(mu);
  names.push_back("ragged_dim_" + std::to_string(names.size()));
  return Ort::ShapeInferContext::SymbolicInteger(names.back().c_str());
}

std::string CheckBias(const std::vector<int64_t>& bias_shape, ONNXTensorElementDataType bias_type,
                      const std::vector<int64_t>& qkv_shape, ONNXTensorElementDataType qkv_type) {
  const int64_t width = qkv_shape.size() == 2 ? qkv_shape[1] : -1;
  if (bias_shape.size() != 1 || bias_shape[0] != width) {
    return "input 'bias' must be 1-D [" + std::to_string(width) + "] (qkv shape " + ShapeString(qkv_shape) +
           "), got shape " + ShapeString(bias_shape);
  }
  if (bias_type != qkv_type) {
    return std::string("input 'bias' (shape ") + ShapeString(bias_shape) + ") has element type " +
           ElementTypeName(bias_type) + ", qkv (shape " + ShapeString(qkv_shape) + ") has " + ElementTypeName(qkv_type);
  }
  return "";
}

OrtStatusPtr InferRaggedAttentionShapes(OrtShapeInferContext* raw) noexcept {
  return GuardStatus([&]() -> OrtStatusPtr {
    Ort::ShapeInferContext ctx(&Ort::GetApi(), raw);
    if (ctx.GetInputCount() < 1) return nullptr;
    // out has qkv's element type: qkv is declared UNDEFINED, and SetOutputShape's type defaults to float.
    OrtTensorTypeAndShapeInfo* raw_info = nullptr;
    Ort::ThrowOnError(Ort::GetApi().ShapeInferContext_GetInputTypeShape(raw, 0, &raw_info));
    ONNXTensorElementDataType qkv_type = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;  // raw_info is owned by ORT
    Ort::ThrowOnError(Ort::GetApi().GetTensorElementType(raw_info, &qkv_type));
    const auto& qkv = ctx.GetInputShape(0);
    if (qkv.size() != 2) return nullptr;
    // An unknown dimension reaches us as the integer -1 with no symbol; handing -1 back would make it a
    // dim_value of -1 (and a later Reshape fails inference), so unknown dims get a fresh symbol instead.
    Ort::ShapeInferContext::Shape out;
    out.push_back(qkv[0].IsInt() && qkv[0].AsInt() < 0 ? FreshSymbol() : qkv[0]);
    if (qkv[1].IsInt() && qkv[1].AsInt() > 0 && qkv[1].AsInt() % 3 == 0) {
      out.emplace_back(qkv[1].AsInt() / 3);
    } else {
      out.push_back(FreshSymbol());
    }
    Ort::Status st = ctx.SetOutputShape(0, out, qkv_type);
    if (!st.IsOK()) return st.release();
    // cls_attn [T]: left to the graph (output 1 is optional and may be absent from the node).
    return nullptr;
  });
}

}  // namespace raggedvit

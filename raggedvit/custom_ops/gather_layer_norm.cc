// Argument checks, the epsilon attribute and shape inference of GatherLayerNorm (shared by every EP).
#include "gather_layer_norm.h"

#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace raggedvit {

namespace {

void ReadOptional(Ort::KernelContext& ctx, size_t i, Ort::ConstValue* value, std::vector<int64_t>* shape,
                  ONNXTensorElementDataType* type, bool* present) {
  if (ctx.GetInputCount() <= i) return;
  *value = ctx.GetInput(i);
  *present = static_cast<bool>(*value);
  if (!*present) return;
  auto info = value->GetTensorTypeAndShapeInfo();
  *shape = info.GetShape();
  *type = info.GetElementType();
}

// "" when `shape` / `type` match `want` / X's type, else the error naming the input and X's shape.
std::string CheckLike(const char* name, const std::vector<int64_t>& shape, ONNXTensorElementDataType type,
                      const std::vector<int64_t>& want, const NormValues& v) {
  if (shape != want) {
    return std::string("input '") + name + "' must have shape " + ShapeString(want) + " (X shape " +
           ShapeString(v.x_shape) + "), got " + ShapeString(shape);
  }
  if (type != v.x_type) {
    return std::string("input '") + name + "' (shape " + ShapeString(shape) + ") has element type " +
           ElementTypeName(type) + ", X (shape " + ShapeString(v.x_shape) + ") has " + ElementTypeName(v.x_type);
  }
  return "";
}

}  // namespace

NormValues ReadNormInputs(Ort::KernelContext& ctx) {
  NormValues v;
  bool present = false;
  ReadOptional(ctx, kNormX, &v.x, &v.x_shape, &v.x_type, &present);
  ReadOptional(ctx, kNormIndex, &v.index, &v.index_shape, &v.index_type, &present);
  ReadOptional(ctx, kNormGamma, &v.gamma, &v.gamma_shape, &v.gamma_type, &present);
  ReadOptional(ctx, kNormBeta, &v.beta, &v.beta_shape, &v.beta_type, &present);
  ReadOptional(ctx, kNormSkip, &v.skip, &v.skip_shape, &v.skip_type, &v.has_skip);
  ReadOptional(ctx, kNormBias, &v.bias, &v.bias_shape, &v.bias_type, &v.has_bias);
  ReadOptional(ctx, kNormCu, &v.cu, &v.cu_shape, &v.cu_type, &v.has_cu);
  return v;
}

std::string CheckNormInputs(const NormValues& v, NormDims* dims) {
  if (v.x_shape.size() != 2) return "input 'X' must be 2-D [T, D], got shape " + ShapeString(v.x_shape);
  const int64_t T = v.x_shape[0], D = v.x_shape[1];
  if (v.index_shape.size() != 1) {
    return "input 'Index' must be 1-D [R], got shape " + ShapeString(v.index_shape) + " (X shape " +
           ShapeString(v.x_shape) + ")";
  }
  if (v.index_type != ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64) {
    return "input 'Index' (shape " + ShapeString(v.index_shape) + ") must be int64, got " +
           ElementTypeName(v.index_type);
  }
  const int64_t R = v.index_shape[0];
  for (int64_t rows : {T, R}) {
    if (!CheckedSize({rows, D}, static_cast<int64_t>(sizeof(float)))) {
      return "X shape " + ShapeString(v.x_shape) + " and Index shape " + ShapeString(v.index_shape) +
             " overflow int64 bytes";
    }
  }
  std::string err = CheckLike("Gamma", v.gamma_shape, v.gamma_type, {D}, v);
  if (err.empty()) err = CheckLike("Beta", v.beta_shape, v.beta_type, {D}, v);
  if (err.empty() && v.has_skip) err = CheckLike("Skip", v.skip_shape, v.skip_type, v.x_shape, v);
  if (err.empty() && v.has_bias) err = CheckLike("Bias", v.bias_shape, v.bias_type, {D}, v);
  if (!err.empty()) return err;
  int64_t B = 0;
  if (v.has_cu) {
    if (v.cu_shape.size() != 1 || v.cu_shape[0] < 1) {
      return "input 'CuSeqlens' must be 1-D [B+1] with at least 1 entry (X shape " + ShapeString(v.x_shape) +
             ", Index shape " + ShapeString(v.index_shape) + "), got shape " + ShapeString(v.cu_shape);
    }
    if (v.cu_type != ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32 && v.cu_type != ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64) {
      return "input 'CuSeqlens' (shape " + ShapeString(v.cu_shape) + ") must be int32 or int64, got " +
             ElementTypeName(v.cu_type);
    }
    B = v.cu_shape[0] - 1;
  }
  dims->T = T;
  dims->R = R;
  dims->D = D;
  dims->B = B;
  return "";
}

float ReadNormEpsilon(const OrtKernelInfo* info) {
  float eps = 1e-5f;
  const std::string err = ReadFloatAttr(info, "epsilon", 0.0f, kFloatMax, &eps);
  if (!err.empty()) throw std::invalid_argument(err);
  return eps;
}

OrtStatusPtr InferGatherLayerNormShapes(OrtShapeInferContext* raw) noexcept {
  return GuardStatus(
      [&]() -> OrtStatusPtr {
        Ort::ShapeInferContext ctx(&Ort::GetApi(), raw);
        if (ctx.GetInputCount() < 2) return nullptr;
        OrtTensorTypeAndShapeInfo* raw_info = nullptr;  // owned by ORT
        Ort::ThrowOnError(Ort::GetApi().ShapeInferContext_GetInputTypeShape(raw, kNormX, &raw_info));
        ONNXTensorElementDataType x_type = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
        Ort::ThrowOnError(Ort::GetApi().GetTensorElementType(raw_info, &x_type));
        const auto& x = ctx.GetInputShape(kNormX);
        const auto& index = ctx.GetInputShape(kNormIndex);
        if (x.size() != 2 || index.size() != 1) return nullptr;  // the kernel reports the ranks
        // unknown dims reach us as -1 without a symbol: give them a fresh symbol (see InferRaggedAttentionShapes)
        auto dim = [](const Ort::ShapeInferContext::SymbolicInteger& d) {
          return d.IsInt() && d.AsInt() < 0 ? FreshSymbol() : d;
        };
        Ort::ShapeInferContext::Shape out{dim(index[0]), dim(x[1])};
        for (size_t i = 0; i < 2; ++i) {
          Ort::Status st = ctx.SetOutputShape(i, out, x_type);
          if (!st.IsOK()) return st.release();
        }
        return nullptr;
      },
      kNormOpName);
}

}  // namespace raggedvit

// Attribute reading, argument checks and shape inference of RaggedLinear (shared by every EP).
#include "ragged_linear.h"

#include <cstdint>
#include <string>

namespace raggedvit {

namespace {

std::string TypeName(ONNXTensorElementDataType t) { return ElementTypeName(t); }

// Element count a*b and its float byte size, both fitting int64 (every buffer the kernels touch is below it).
bool FitsBytes(int64_t a, int64_t b) { return CheckedSize({a, b}, static_cast<int64_t>(sizeof(float))); }

void Describe(const Ort::ConstValue& v, std::vector<int64_t>* shape, ONNXTensorElementDataType* type) {
  auto info = v.GetTensorTypeAndShapeInfo();
  *shape = info.GetShape();
  *type = info.GetElementType();
}

}  // namespace

std::string ReadLinearAttrs(const OrtKernelInfo* info, LinearAttrs* attrs) {
  attrs->activation = 0;
  return ReadIntAttr(info, "activation", 0, 1, &attrs->activation);  // 0 none, 1 GELU (erf)
}

LinearValues ReadLinearInputs(Ort::KernelContext& ctx) {
  LinearValues v;
  const size_t n = ctx.GetInputCount();
  v.x = ctx.GetInput(kLinearX);
  v.w = ctx.GetInput(kLinearW);
  if (n > kLinearBias) v.bias = ctx.GetInput(kLinearBias);
  if (n > kLinearResidual) v.residual = ctx.GetInput(kLinearResidual);
  if (n > kLinearCu) v.cu = ctx.GetInput(kLinearCu);
  LinearInputs& in = v.info;
  Describe(v.x, &in.x, &in.x_type);
  Describe(v.w, &in.w, &in.w_type);
  in.has_bias = static_cast<bool>(v.bias);
  in.has_residual = static_cast<bool>(v.residual);
  in.has_cu = static_cast<bool>(v.cu);
  if (in.has_bias) Describe(v.bias, &in.bias, &in.bias_type);
  if (in.has_residual) Describe(v.residual, &in.residual, &in.residual_type);
  if (in.has_cu) Describe(v.cu, &in.cu, &in.cu_type);
  return v;
}

std::string CheckLinearInputs(const LinearInputs& in, LinearDims* dims) {
  if (in.x.size() != 2) return "input 'X' must be 2-D [T, K], got shape " + ShapeString(in.x);
  const int64_t T = in.x[0], K = in.x[1];
  const std::string x_shape = "X shape " + ShapeString(in.x);
  if (in.w.size() != 2 || in.w[1] != K) {
    return "input 'W' must be 2-D [N, K] with K = " + std::to_string(K) + " (" + x_shape + "), got shape " +
           ShapeString(in.w);
  }
  const int64_t N = in.w[0];
  const std::string shapes = "(" + x_shape + ", W shape " + ShapeString(in.w) + ")";
  if (!FitsBytes(T, K) || !FitsBytes(N, K) || !FitsBytes(T, N)) {
    return "T*K, N*K or T*N elements (T = " + std::to_string(T) + ", N = " + std::to_string(N) +
           ", K = " + std::to_string(K) + ") overflow int64 bytes " + shapes;
  }
  if (in.w_type != in.x_type) {
    return "input 'W' (shape " + ShapeString(in.w) + ") has element type " + TypeName(in.w_type) + ", X (shape " +
           ShapeString(in.x) + ") has " + TypeName(in.x_type);
  }
  if (in.has_bias) {
    if (in.bias.size() != 1 || in.bias[0] != N) {
      return "input 'Bias' must be 1-D [N] = [" + std::to_string(N) + "] " + shapes + ", got shape " +
             ShapeString(in.bias);
    }
    if (in.bias_type != in.x_type) {
      return "input 'Bias' (shape " + ShapeString(in.bias) + ") has element type " + TypeName(in.bias_type) +
             ", X (shape " + ShapeString(in.x) + ") has " + TypeName(in.x_type);
    }
  }
  if (in.has_residual) {
    if (in.residual.size() != 2 || in.residual[0] != T || in.residual[1] != N) {
      return "input 'Residual' must be 2-D [T, N] = [" + std::to_string(T) + ", " + std::to_string(N) + "] " +
             shapes + ", got shape " + ShapeString(in.residual);
    }
    if (in.residual_type != in.x_type) {
      return "input 'Residual' (shape " + ShapeString(in.residual) + ") has element type " +
             TypeName(in.residual_type) + ", X (shape " + ShapeString(in.x) + ") has " + TypeName(in.x_type);
    }
  }
  int64_t B = 0;
  if (in.has_cu) {
    if (in.cu.size() != 1 || in.cu[0] < 1) {
      return "input 'CuSeqlens' must be 1-D [B+1] with at least 1 entry (" + x_shape + "), got shape " +
             ShapeString(in.cu);
    }
    if (in.cu_type != ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32 && in.cu_type != ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64) {
      return "input 'CuSeqlens' (shape " + ShapeString(in.cu) + ") must be int32 or int64, got " +
             TypeName(in.cu_type);
    }
    B = in.cu[0] - 1;
  }
  dims->T = T;
  dims->N = N;
  dims->K = K;
  dims->B = B;
  return "";
}

OrtStatusPtr InferRaggedLinearShapes(OrtShapeInferContext* raw) noexcept {
  return GuardStatus(
      [&]() -> OrtStatusPtr {
        Ort::ShapeInferContext ctx(&Ort::GetApi(), raw);
        if (ctx.GetInputCount() < 2) return nullptr;
        // Y has X's element type (SetOutputShape's type defaults to float)
        OrtTensorTypeAndShapeInfo* raw_info = nullptr;  // owned by ORT
        Ort::ThrowOnError(Ort::GetApi().ShapeInferContext_GetInputTypeShape(raw, kLinearX, &raw_info));
        ONNXTensorElementDataType x_type = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
        Ort::ThrowOnError(Ort::GetApi().GetTensorElementType(raw_info, &x_type));
        const auto& x = ctx.GetInputShape(kLinearX);
        const auto& w = ctx.GetInputShape(kLinearW);
        if (x.size() != 2 || w.size() != 2) return nullptr;  // the kernel reports the ranks
        // unknown dims reach us as -1 without a symbol: give them a fresh symbol (see InferRaggedAttentionShapes)
        Ort::ShapeInferContext::Shape y;
        y.push_back(x[0].IsInt() && x[0].AsInt() < 0 ? FreshSymbol() : x[0]);
        y.push_back(w[0].IsInt() && w[0].AsInt() < 0 ? FreshSymbol() : w[0]);
        Ort::Status st = ctx.SetOutputShape(0, y, x_type);
        return st.IsOK() ? nullptr : st.release();
      },
      kLinearOpName);
}

}  // namespace raggedvit

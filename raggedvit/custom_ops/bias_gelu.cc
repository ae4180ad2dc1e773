// Argument checks and shape inference of BiasGelu (shared by every EP).
#include "bias_gelu.h"

#include <cstdint>
#include <string>

namespace raggedvit {

GeluValues ReadGeluInputs(Ort::KernelContext& ctx) {
  GeluValues v;
  v.x = ctx.GetInput(kGeluX);
  if (ctx.GetInputCount() > kGeluBias) v.bias = ctx.GetInput(kGeluBias);
  auto xi = v.x.GetTensorTypeAndShapeInfo();
  v.x_shape = xi.GetShape();
  v.x_type = xi.GetElementType();
  v.has_bias = static_cast<bool>(v.bias);
  if (v.has_bias) {
    auto bi = v.bias.GetTensorTypeAndShapeInfo();
    v.bias_shape = bi.GetShape();
    v.bias_type = bi.GetElementType();
  }
  return v;
}

std::string CheckGeluInputs(const GeluValues& v, GeluDims* dims) {
  if (v.x_shape.empty()) return "input 'X' must have rank >= 1 [..., N], got a scalar";
  const int64_t N = v.x_shape.back();
  if (!CheckedSize(v.x_shape, static_cast<int64_t>(sizeof(float)))) {
    return "X shape " + ShapeString(v.x_shape) + " overflows int64 bytes";
  }
  int64_t M = 1;  // the product of the leading dims: no overflow once the whole size fits
  for (size_t i = 0; i + 1 < v.x_shape.size(); ++i) M *= v.x_shape[i];
  if (v.has_bias) {
    if (v.bias_shape.size() != 1 || v.bias_shape[0] != N) {
      return "input 'Bias' must be 1-D [N] = [" + std::to_string(N) + "] (X shape " + ShapeString(v.x_shape) +
             "), got shape " + ShapeString(v.bias_shape);
    }
    if (v.bias_type != v.x_type) {
      return "input 'Bias' (shape " + ShapeString(v.bias_shape) + ") has element type " +
             ElementTypeName(v.bias_type) + ", X (shape " + ShapeString(v.x_shape) + ") has " +
             ElementTypeName(v.x_type);
    }
  }
  dims->M = M;
  dims->N = N;
  return "";
}

OrtStatusPtr InferBiasGeluShapes(OrtShapeInferContext* raw) noexcept {
  return GuardStatus(
      [&]() -> OrtStatusPtr {
        Ort::ShapeInferContext ctx(&Ort::GetApi(), raw);
        if (ctx.GetInputCount() < 1) return nullptr;
        OrtTensorTypeAndShapeInfo* raw_info = nullptr;  // owned by ORT
        Ort::ThrowOnError(Ort::GetApi().ShapeInferContext_GetInputTypeShape(raw, kGeluX, &raw_info));
        ONNXTensorElementDataType x_type = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
        Ort::ThrowOnError(Ort::GetApi().GetTensorElementType(raw_info, &x_type));
        // unknown dims reach us as -1 without a symbol: give them a fresh symbol (see InferRaggedAttentionShapes)
        Ort::ShapeInferContext::Shape y;
        for (const auto& d : ctx.GetInputShape(kGeluX)) y.push_back(d.IsInt() && d.AsInt() < 0 ? FreshSymbol() : d);
        Ort::Status st = ctx.SetOutputShape(0, y, x_type);
        return st.IsOK() ? nullptr : st.release();
      },
      kGeluOpName);
}

}  // namespace raggedvit

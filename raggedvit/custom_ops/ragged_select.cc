// Attribute reading, argument checks and shape inference of RaggedSelect (shared by every EP).
#include "ragged_select.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

namespace raggedvit {

namespace {

// Element count a*b and its int64 byte size fit int64.
bool FitsBytes(int64_t a, int64_t b) { return CheckedSize({a, b}, static_cast<int64_t>(sizeof(int64_t))); }

}  // namespace

std::string ReadSelectAttrs(const OrtKernelInfo* info, SelectAttrs* a) {
  std::string err = ReadIntAttr(info, "width", 1, kInt64Max, &a->width, /*required=*/true);
  if (err.empty()) err = ReadIntAttr(info, "bound", 0, a->width, &a->bound, /*required=*/true);
  if (err.empty()) err = ReadIntAttr(info, "num_prefix", 0, kInt64Max, &a->num_prefix);
  if (err.empty()) err = ReadIntAttr(info, "policy", 0, 1, &a->policy);
  // the fraction the policy uses is in (0, 1] (ceil(P*keep) stays <= P); the other one is 0 (unset) or in (0, 1]
  if (err.empty()) err = ReadFloatAttr(info, "keep", 0.0f, 1.0f, &a->keep, /*lo_open=*/a->policy == 0);
  if (err.empty()) err = ReadFloatAttr(info, "mass", 0.0f, 1.0f, &a->mass, /*lo_open=*/a->policy == 1);
  if (!err.empty()) return err;
  if (a->policy == 0 && !(a->keep > 0.0f)) return "attribute 'keep' (float in (0, 1]) is required with policy 0 (count)";
  if (a->policy == 1 && !(a->mass > 0.0f)) return "attribute 'mass' (float in (0, 1]) is required with policy 1 (mass)";
  return "";
}

std::string CheckSelectInputs(const std::vector<int64_t>& scores_shape, ONNXTensorElementDataType scores_type,
                              const std::vector<int64_t>& cu_shape, ONNXTensorElementDataType cu_type,
                              const SelectAttrs& attrs, SelectDims* dims) {
  const std::string shapes = "(scores shape " + ShapeString(scores_shape) + ", cu shape " + ShapeString(cu_shape) + ")";
  if (scores_shape.size() != 1) return "input 'scores' must be 1-D [T] " + shapes;
  if (scores_type != ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT) {
    return std::string("input 'scores' must be float, got ") + ElementTypeName(scores_type) + " " + shapes;
  }
  if (cu_shape.size() != 1 || cu_shape[0] < 2) return "input 'cu' must be 1-D [B+1] with B >= 1 " + shapes;
  if (cu_type != ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64) {
    return std::string("input 'cu' must be int64, got ") + ElementTypeName(cu_type) + " " + shapes;
  }
  const int64_t B = cu_shape[0] - 1;
  const int64_t width_limit = std::max(scores_shape[0], kSelectWidthFloor);
  if (attrs.width > width_limit) {
    return "attribute 'width' = " + std::to_string(attrs.width) +
           " is far beyond the input: an image has at most T = " + std::to_string(scores_shape[0]) +
           " rows, so width may be at most max(T, " +
           std::to_string(kSelectWidthFloor) + ") = " + std::to_string(width_limit) +
           "; set it to the rows per image before the stage " + shapes;
  }
  if (!FitsBytes(B, attrs.width)) {
    return "B * width (B = " + std::to_string(B) + ", width = " + std::to_string(attrs.width) +
           ") int64 slots overflow int64 bytes " + shapes;
  }
  dims->T = scores_shape[0];
  dims->B = B;
  dims->rows = B * attrs.bound;  // bound <= width: fits as B * width does
  dims->slots = B * attrs.width;
  return "";
}

std::string CheckSelectCu(const int64_t* cu, const SelectDims& d, const SelectAttrs& attrs) {
  const std::string where = "input 'cu' (shape [" + std::to_string(d.B + 1) + "], scores shape [" +
                            std::to_string(d.T) + "])";
  if (cu[0] < 0) return where + " must start at >= 0, got cu[0] = " + std::to_string(cu[0]);
  for (int64_t b = 0; b < d.B; ++b) {
    const int64_t lo = cu[b], hi = cu[b + 1];
    if (hi < lo) {
      return where + " must be non-decreasing, got cu[" + std::to_string(b + 1) + "] = " + std::to_string(hi) +
             " < cu[" + std::to_string(b) + "] = " + std::to_string(lo);
    }
    if (hi > d.T) {
      return where + ": cu[" + std::to_string(b + 1) + "] = " + std::to_string(hi) + " exceeds T = " +
             std::to_string(d.T);
    }
    if (hi - lo > attrs.width) {
      return where + ": image " + std::to_string(b) + " has " + std::to_string(hi - lo) +
             " rows, above attribute width = " + std::to_string(attrs.width);
    }
  }
  return "";
}

OrtStatusPtr InferRaggedSelectShapes(OrtShapeInferContext* raw) noexcept {
  return GuardStatus(
      [&]() -> OrtStatusPtr {
        Ort::ShapeInferContext ctx(&Ort::GetApi(), raw);
        if (ctx.GetInputCount() < kSelectNumInputs) return nullptr;
        const auto& cu = ctx.GetInputShape(kSelectCu);
        if (cu.size() != 1) return nullptr;  // the kernel reports the rank
        const int64_t bound = ctx.GetAttrInt("bound");
        Ort::ShapeInferContext::Shape rows, cu_new, per_image;
        int64_t B = -1, n = 0;
        if (cu[0].IsInt() && cu[0].AsInt() >= 1) B = cu[0].AsInt() - 1;
        if (B >= 0 && bound >= 0 && CheckedMul(B, bound, &n)) {
          rows.push_back(Ort::ShapeInferContext::SymbolicInteger(n));
          per_image.push_back(Ort::ShapeInferContext::SymbolicInteger(B));
          cu_new.push_back(cu[0]);
        } else {
          // unknown dims reach us as -1 without a symbol: give them a fresh symbol (see InferRaggedAttentionShapes)
          rows.push_back(FreshSymbol());
          per_image.push_back(FreshSymbol());
          cu_new.push_back(cu[0].IsInt() && cu[0].AsInt() < 0 ? FreshSymbol() : cu[0]);
        }
        constexpr ONNXTensorElementDataType kI64 = ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64;
        for (size_t i : {kSelectSrc, kSelectSeqId, kSelectPos}) {
          Ort::Status st = ctx.SetOutputShape(i, rows, kI64);
          if (!st.IsOK()) return st.release();
        }
        Ort::Status st = ctx.SetOutputShape(kSelectCuNew, cu_new, kI64);
        if (!st.IsOK()) return st.release();
        st = ctx.SetOutputShape(kSelectK, per_image, kI64);
        return st.IsOK() ? nullptr : st.release();
      },
      kSelectOpName);
}

}  // namespace raggedvit

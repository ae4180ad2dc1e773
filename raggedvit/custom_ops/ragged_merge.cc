// Attribute reading, argument checks and shape inference of RaggedMerge (shared by every EP).
#include "ragged_merge.h"

#include <cstdint>
#include <string>
#include <utility>

namespace raggedvit {

namespace {

void Describe(const Ort::ConstValue& v, std::vector<int64_t>* shape, ONNXTensorElementDataType* type) {
  auto info = v.GetTensorTypeAndShapeInfo();
  *shape = info.GetShape();
  *type = info.GetElementType();
}

bool IsMergeFloat(ONNXTensorElementDataType t) {
  return t == ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT || t == ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16 ||
         t == ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16;
}

// An int attribute of the node in shape inference: false when absent or of another type (no exception).
bool InferAttrInt(OrtShapeInferContext* raw, const char* name, int64_t* out) {
  const OrtApi& api = Ort::GetApi();
  const OrtOpAttr* attr = nullptr;
  OrtStatus* st = api.ShapeInferContext_GetAttribute(raw, name, &attr);
  if (st != nullptr) {
    api.ReleaseStatus(st);
    return false;
  }
  if (attr == nullptr) return false;
  size_t bytes = 0;
  st = api.ReadOpAttr(attr, ORT_OP_ATTR_INT, out, sizeof(*out), &bytes);
  if (st != nullptr) {
    api.ReleaseStatus(st);
    return false;
  }
  return true;
}

}  // namespace

std::string ReadMergeAttrs(const OrtKernelInfo* info, MergeAttrs* a) {
  // num_heads <= kMaxNumHeads: 3*num_heads (the qkv width per head dim) fits int64
  std::string err = ReadIntAttr(info, "num_heads", 1, kMaxNumHeads, &a->num_heads, /*required=*/true);
  if (err.empty()) err = ReadIntAttr(info, "num_prefix", 0, kInt64Max, &a->num_prefix);
  if (err.empty()) err = ReadIntAttr(info, "r", 0, kInt64Max, &a->r, /*required=*/true);
  int64_t class_token = 1;
  if (err.empty()) err = ReadIntAttr(info, "class_token", 0, 1, &class_token, /*required=*/true);
  a->class_token = class_token != 0;
  return err;
}

MergeValues ReadMergeInputs(Ort::KernelContext& ctx) {
  MergeValues v;
  const size_t count = ctx.GetInputCount();
  v.x = ctx.GetInput(kMergeX);
  v.qkv = ctx.GetInput(kMergeQkv);
  if (count > kMergeQkvBias) v.qkv_bias = ctx.GetInput(kMergeQkvBias);
  if (count > kMergeSize) v.size = ctx.GetInput(kMergeSize);
  v.cu = ctx.GetInput(kMergeCu);  // required: MissingInputError refused a node without it
  if (count > kMergeSkip) v.skip = ctx.GetInput(kMergeSkip);
  if (count > kMergeSkipBias) v.skip_bias = ctx.GetInput(kMergeSkipBias);
  MergeInputs& in = v.info;
  Describe(v.x, &in.x, &in.x_type);
  Describe(v.qkv, &in.qkv, &in.qkv_type);
  Describe(v.cu, &in.cu, &in.cu_type);
  in.has_qkv_bias = static_cast<bool>(v.qkv_bias);
  in.has_size = static_cast<bool>(v.size);
  if (in.has_qkv_bias) Describe(v.qkv_bias, &in.qkv_bias, &in.qkv_bias_type);
  if (in.has_size) Describe(v.size, &in.size, &in.size_type);
  in.has_skip = static_cast<bool>(v.skip);
  in.has_skip_bias = static_cast<bool>(v.skip_bias);
  if (in.has_skip) Describe(v.skip, &in.skip, &in.skip_type);
  if (in.has_skip_bias) Describe(v.skip_bias, &in.skip_bias, &in.skip_bias_type);
  return v;
}

std::string CheckMergeInputs(const MergeInputs& in, const MergeAttrs& attrs, MergeDims* dims) {
  std::string shapes = "(x shape " + ShapeString(in.x) + ", qkv shape " + ShapeString(in.qkv);
  if (in.has_qkv_bias) shapes += ", qkv_bias shape " + ShapeString(in.qkv_bias);
  if (in.has_size) shapes += ", size shape " + ShapeString(in.size);
  shapes += ", cu shape " + ShapeString(in.cu);
  if (in.has_skip) shapes += ", skip shape " + ShapeString(in.skip);
  if (in.has_skip_bias) shapes += ", skip_bias shape " + ShapeString(in.skip_bias);
  shapes += ")";
  if (in.x.size() != 2) return "input 'x' must be 2-D [T, C] " + shapes;
  if (!IsMergeFloat(in.x_type)) {
    return std::string("input 'x' must be float, float16 or bfloat16, got ") + ElementTypeName(in.x_type) + " " +
           shapes;
  }
  const int64_t T = in.x[0], C = in.x[1];
  if (in.qkv.size() != 2) return "input 'qkv' must be 2-D [T, 3*H*Dh] " + shapes;
  if (in.qkv_type != in.x_type) {
    return std::string("input 'qkv' has element type ") + ElementTypeName(in.qkv_type) + ", x has " +
           ElementTypeName(in.x_type) + " " + shapes;
  }
  if (in.qkv[0] != T) {
    return "input 'qkv' must have T = " + std::to_string(T) + " rows (one per row of x), got " +
           std::to_string(in.qkv[0]) + " " + shapes;
  }
  const int64_t W = in.qkv[1], H = attrs.num_heads;
  if (W <= 0 || W % (3 * H) != 0) {  // 3*H fits int64 (ReadMergeAttrs)
    return "input 'qkv' width " + std::to_string(W) + " must be a positive multiple of 3*num_heads = " +
           std::to_string(3 * H) + " " + shapes;
  }
  if (in.has_qkv_bias) {
    if (in.qkv_bias.size() != 1 || in.qkv_bias[0] != W) {
      return "input 'qkv_bias' must be 1-D [" + std::to_string(W) + "] (qkv's width) " + shapes;
    }
    if (in.qkv_bias_type != in.x_type) {
      return std::string("input 'qkv_bias' has element type ") + ElementTypeName(in.qkv_bias_type) + ", x has " +
             ElementTypeName(in.x_type) + " " + shapes;
    }
  }
  if (in.has_size) {
    if (in.size.size() != 1 || in.size[0] != T) {
      return "input 'size' must be 1-D [T] = [" + std::to_string(T) + "] " + shapes;
    }
    if (in.size_type != ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT) {
      return std::string("input 'size' must be float, got ") + ElementTypeName(in.size_type) + " " + shapes;
    }
  }
  if (in.has_skip_bias && !in.has_skip) return "input 'skip_bias' is given without input 'skip' " + shapes;
  if (in.has_skip) {
    if (in.skip != in.x) return "input 'skip' must have x's shape [T, C] " + shapes;
    if (in.skip_type != in.x_type) {
      return std::string("input 'skip' has element type ") + ElementTypeName(in.skip_type) + ", x has " +
             ElementTypeName(in.x_type) + " " + shapes;
    }
  }
  if (in.has_skip_bias) {
    if (in.skip_bias.size() != 1 || in.skip_bias[0] != C) {
      return "input 'skip_bias' must be 1-D [" + std::to_string(C) + "] (x's width) " + shapes;
    }
    if (in.skip_bias_type != in.x_type) {
      return std::string("input 'skip_bias' has element type ") + ElementTypeName(in.skip_bias_type) + ", x has " +
             ElementTypeName(in.x_type) + " " + shapes;
    }
  }
  if (in.cu.size() != 1 || in.cu[0] < 2) return "input 'cu' must be 1-D [B+1] with B >= 1 " + shapes;
  if (in.cu_type != ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64) {
    return std::string("input 'cu' must be int64, got ") + ElementTypeName(in.cu_type) + " " + shapes;
  }
  const int64_t B = in.cu[0] - 1;
  if (T % B != 0) {
    return "T = " + std::to_string(T) + " rows of x are not B = " + std::to_string(B) +
           " images of equal length (T % B != 0) " + shapes;
  }
  const int64_t n = T / B, p = attrs.num_prefix;
  if (p > n) {
    return "attribute 'num_prefix' = " + std::to_string(p) + " exceeds the n = T / B = " + std::to_string(n) +
           " rows per image " + shapes;
  }
  MergeDims d;
  d.T = T;
  d.B = B;
  d.n = n;
  d.C = C;
  d.H = H;
  d.Dh = W / (3 * H);
  d.r_eff = MergedCount(n, p, attrs.r);
  d.m = n - d.r_eff;
  MergeSets(n, p, &d.a0, &d.b0, &d.n_A, &d.n_B);
  // every buffer in float32 bytes (the widest element; int64 outputs have at most T entries): x, qkv, the metric,
  // the outputs (B*m <= T rows) and one image's score matrix
  constexpr int64_t kBytes = static_cast<int64_t>(sizeof(float));
  const bool fits = CheckedSize({T, C}, kBytes) && CheckedSize({T, W}, kBytes) &&
                    CheckedSize({T}, static_cast<int64_t>(sizeof(int64_t))) && CheckedSize({d.n_A, d.n_B}, kBytes) &&
                    CheckedSize({B, d.n_A, d.n_B}, kBytes);
  if (!fits) {
    return "T*C, T*3*H*Dh or the n_A x n_B score matrices (T = " + std::to_string(T) + ", C = " + std::to_string(C) +
           ", n_A = " + std::to_string(d.n_A) + ", n_B = " + std::to_string(d.n_B) + ") overflow int64 bytes " +
           shapes;
  }
  *dims = d;
  return "";
}

std::string CheckMergeCu(const int64_t* cu, const MergeDims& d) {
  for (int64_t b = 0; b <= d.B; ++b) {
    if (cu[b] != b * d.n) {  // b*n <= T
      return "input 'cu' (shape [" + std::to_string(d.B + 1) + "], x rows T = " + std::to_string(d.T) +
             ") must be b*n with n = T / B = " + std::to_string(d.n) + " (every image n rows), got cu[" +
             std::to_string(b) + "] = " + std::to_string(cu[b]) + " instead of " + std::to_string(b * d.n);
    }
  }
  return "";
}

OrtStatusPtr InferRaggedMergeShapes(OrtShapeInferContext* raw) noexcept {
  return GuardStatus(
      [&]() -> OrtStatusPtr {
        Ort::ShapeInferContext ctx(&Ort::GetApi(), raw);
        if (ctx.GetInputCount() <= kMergeCu) return nullptr;  // the kernel names the missing input
        OrtTensorTypeAndShapeInfo* raw_info = nullptr;              // owned by ORT
        Ort::ThrowOnError(Ort::GetApi().ShapeInferContext_GetInputTypeShape(raw, kMergeX, &raw_info));
        ONNXTensorElementDataType x_type = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
        Ort::ThrowOnError(Ort::GetApi().GetTensorElementType(raw_info, &x_type));
        const auto& x = ctx.GetInputShape(kMergeX);
        const auto& cu = ctx.GetInputShape(kMergeCu);
        if (x.size() != 2 || cu.size() != 1) return nullptr;  // the kernel reports the ranks
        auto dim = [](const Ort::ShapeInferContext::SymbolicInteger& v) {
          // unknown dims reach us as -1 without a symbol: give them a fresh symbol (see InferRaggedAttentionShapes)
          return v.IsInt() && v.AsInt() < 0 ? FreshSymbol() : v;
        };
        using Dim = Ort::ShapeInferContext::SymbolicInteger;
        Ort::ShapeInferContext::Shape rows{FreshSymbol()}, scores{FreshSymbol()}, cu_out{dim(cu[0])};
        int64_t heads = 0, p = 0, r = 0;
        const bool attrs_ok = InferAttrInt(raw, "num_heads", &heads) && heads >= 1 && InferAttrInt(raw, "r", &r) &&
                              r >= 0 && (!InferAttrInt(raw, "num_prefix", &p) || p >= 0);
        if (attrs_ok && x[0].IsInt() && cu[0].IsInt() && x[0].AsInt() >= 0 && cu[0].AsInt() >= 2) {
          const int64_t T = x[0].AsInt(), B = cu[0].AsInt() - 1;
          if (T % B == 0 && p <= T / B) {
            const int64_t n = T / B, m = n - MergedCount(n, p, r);
            int64_t a0 = 0, b0 = 0, n_A = 0, n_B = 0;
            MergeSets(n, p, &a0, &b0, &n_A, &n_B);
            rows = {Dim(B * m)};  // B*m, B*n_A <= T
            scores = {Dim(B * n_A)};
          }
        }
        constexpr ONNXTensorElementDataType kF32 = ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
        constexpr ONNXTensorElementDataType kI64 = ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64;
        const Ort::ShapeInferContext::Shape x_out{rows[0], dim(x[1])};
        const std::pair<size_t, std::pair<const Ort::ShapeInferContext::Shape*, ONNXTensorElementDataType>> outs[] = {
            {kMergeXOut, {&x_out, x_type}}, {kMergeSizeOut, {&rows, kF32}}, {kMergeCuOut, {&cu_out, kI64}},
            {kMergeSrc, {&rows, kI64}},     {kMergeKeyBias, {&rows, kF32}}, {kMergeScore, {&scores, kF32}}};
        for (const auto& o : outs) {
          Ort::Status st = ctx.SetOutputShape(o.first, *o.second.first, o.second.second);
          if (!st.IsOK()) return st.release();
        }
        return nullptr;
      },
      kMergeOpName);
}

}  // namespace raggedvit

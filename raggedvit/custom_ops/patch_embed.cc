// Argument checks, the patch attribute and shape inference of PatchEmbed (shared by every EP).
#include "patch_embed.h"

#include <cstdint>
#include <stdexcept>
#include <string>

namespace raggedvit {

namespace {

void Read(Ort::KernelContext& ctx, size_t i, Ort::ConstValue* value, std::vector<int64_t>* shape,
          ONNXTensorElementDataType* type) {
  if (ctx.GetInputCount() <= i) return;
  *value = ctx.GetInput(i);
  if (!*value) return;
  auto info = value->GetTensorTypeAndShapeInfo();
  *shape = info.GetShape();
  *type = info.GetElementType();
}

std::string Where(const EmbedValues& v, int64_t patch) {
  return " (Images shape " + ShapeString(v.images_shape) + ", patch " + std::to_string(patch) + ")";
}

// "" when `shape` / `type` match `want` / `want_type`, else the error naming the input, Images' shape and patch.
std::string CheckInput(const char* name, const std::vector<int64_t>& shape, ONNXTensorElementDataType type,
                       const std::vector<int64_t>& want, ONNXTensorElementDataType want_type, const EmbedValues& v,
                       int64_t patch) {
  if (shape != want) {
    return std::string("input '") + name + "' must have shape " + ShapeString(want) + Where(v, patch) + ", got " +
           ShapeString(shape);
  }
  if (type != want_type) {
    return std::string("input '") + name + "' (shape " + ShapeString(shape) + ") must be " +
           ElementTypeName(want_type) + ", got " + ElementTypeName(type);
  }
  return "";
}

bool FitsBytes(int64_t a, int64_t b, int64_t c, int64_t d) {  // a * b * c * d * sizeof(float) fits int64
  return CheckedSize({a, b, c, d}, static_cast<int64_t>(sizeof(float)));
}

}  // namespace

EmbedValues ReadEmbedInputs(Ort::KernelContext& ctx) {
  EmbedValues v;
  Read(ctx, kEmbedImages, &v.images, &v.images_shape, &v.images_type);
  Read(ctx, kEmbedWeight, &v.weight, &v.weight_shape, &v.weight_type);
  Read(ctx, kEmbedPrefix, &v.prefix, &v.prefix_shape, &v.prefix_type);
  Read(ctx, kEmbedPos, &v.pos, &v.pos_shape, &v.pos_type);
  return v;
}

std::string CheckEmbedInputs(const EmbedValues& v, int64_t patch, EmbedDims* dims) {
  if (v.images_shape.size() != 4) {
    return "input 'Images' must be 4-D [B, C, H, W], got shape " + ShapeString(v.images_shape);
  }
  if (v.images_type != ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT && v.images_type != ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16) {
    return "input 'Images' (shape " + ShapeString(v.images_shape) + ") must be float or float16, got " +
           ElementTypeName(v.images_type);
  }
  EmbedDims d;
  d.B = v.images_shape[0];
  d.C = v.images_shape[1];
  d.H = v.images_shape[2];
  d.W = v.images_shape[3];
  d.patch = patch;
  d.gh = d.H / patch;
  d.gw = d.W / patch;
  // CheckedSize also bounds the non-zero dims' product: gh * gw <= H * W fits even when B or C is 0
  if (!FitsBytes(d.B, d.C, d.H, d.W) || !CheckedMul(d.C, patch * patch, &d.K) || !CheckedMul(d.gh, d.gw, &d.L)) {
    return "Images shape " + ShapeString(v.images_shape) + " and patch " + std::to_string(patch) +
           " overflow int64 bytes";
  }
  if (v.weight_shape.size() != 2) {
    return "input 'Weight' must be 2-D [K = " + std::to_string(d.K) + ", N]" + Where(v, patch) + ", got shape " +
           ShapeString(v.weight_shape);
  }
  d.N = v.weight_shape[1];
  if (v.prefix_shape.size() != 2) {
    return "input 'Prefix' must be 2-D [P, " + std::to_string(d.N) + "], got shape " + ShapeString(v.prefix_shape);
  }
  d.P = v.prefix_shape[0];
  int64_t rows = 0;
  if (!CheckedAdd(d.P, d.L, &rows) || !FitsBytes(d.K, d.N, 1, 1) || !FitsBytes(rows, d.N, 1, 1) ||
      !FitsBytes(d.B, rows, d.N, 1)) {
    return "Weight shape " + ShapeString(v.weight_shape) + " and Prefix shape " + ShapeString(v.prefix_shape) +
           Where(v, patch) + " overflow int64 bytes";
  }
  std::string err = CheckInput("Weight", v.weight_shape, v.weight_type, {d.K, d.N},
                               ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16, v, patch);
  if (err.empty()) {
    err = CheckInput("Prefix", v.prefix_shape, v.prefix_type, {d.P, d.N}, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, v,
                     patch);
  }
  if (err.empty()) {
    err = CheckInput("Pos", v.pos_shape, v.pos_type, {rows, d.N}, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, v, patch);
  }
  if (!err.empty()) return err;
  *dims = d;
  return "";
}

int64_t ReadEmbedPatch(const OrtKernelInfo* info) {
  int64_t patch = 0;
  const std::string err = ReadIntAttr(info, "patch", 1, int64_t{1} << 15, &patch, /*required=*/true);
  if (!err.empty()) throw std::invalid_argument(err);
  return patch;
}

OrtStatusPtr InferPatchEmbedShapes(OrtShapeInferContext* raw) noexcept {
  return GuardStatus(
      [&]() -> OrtStatusPtr {
        Ort::ShapeInferContext ctx(&Ort::GetApi(), raw);
        if (ctx.GetInputCount() < kEmbedNumInputs) return nullptr;
        const auto& images = ctx.GetInputShape(kEmbedImages);
        const auto& weight = ctx.GetInputShape(kEmbedWeight);
        const auto& pos = ctx.GetInputShape(kEmbedPos);
        if (images.size() != 4 || weight.size() != 2 || pos.size() != 2) return nullptr;  // the kernel reports it
        auto dim = [](const Ort::ShapeInferContext::SymbolicInteger& d) {
          return d.IsInt() && d.AsInt() < 0 ? FreshSymbol() : d;
        };
        Ort::ShapeInferContext::Shape out{dim(images[0]), dim(pos[0]), dim(weight[1])};
        Ort::Status st = ctx.SetOutputShape(0, out, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16);
        return st.IsOK() ? nullptr : st.release();
      },
      kEmbedOpName);
}

}  // namespace raggedvit

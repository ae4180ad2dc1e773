// com.raggedvit::PatchEmbed v1: argument checks and the op definition shared by the CPU and CUDA kernels. No CUDA
// here.
//
//   Images [B, C, H, W]  float | float16: the pixels (a stride-`patch` conv reads the (gh * patch, gw * patch)
//                        corner, gh = H / patch, gw = W / patch)
//   Weight [K, N]        float16, K = C * patch * patch: Conv2d's weight [N, C, patch, patch] flattened, transposed
//   Prefix [P, N]        float: the prefix rows (class / distillation tokens; P may be 0)
//   Pos    [P + L, N]    float, L = gh * gw: the position table (the conv's bias folded into its patch rows)
//   attribute patch: int >= 1 (the conv's kernel size and stride)
//   Out    [B, P + L, N] float16: Out[b, j] = Prefix[j] + Pos[j]; Out[b, P + l] = patch l of image b (row-major
//                        over the grid, k = (c * patch + ky) * patch + kx, pixels rounded to float16) @ Weight +
//                        Pos[P + l], accumulated in float, rounded once
// The kernel: raggedvit/kernels/_embed_kernel.py (CUDA, AOT) and cpu/patch_embed_cpu.cc (the same function).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ragged_attention.h"  // ShapeString, ElementTypeName, CheckedMul, MakeStatus, GuardStatus, FreshSymbol

namespace raggedvit {

constexpr const char* kEmbedOpName = "PatchEmbed";
constexpr size_t kEmbedImages = 0, kEmbedWeight = 1, kEmbedPrefix = 2, kEmbedPos = 3, kEmbedNumInputs = 4;
constexpr InputSpec kEmbedInputs[kEmbedNumInputs] = {
    {"Images", true}, {"Weight", true}, {"Prefix", true}, {"Pos", true}};

struct EmbedDims {
  int64_t B = 0, C = 0, H = 0, W = 0, patch = 0, gh = 0, gw = 0, L = 0, P = 0, N = 0, K = 0;
};

// The inputs of a kernel call (ctx must outlive the returned values).
struct EmbedValues {
  Ort::ConstValue images{nullptr}, weight{nullptr}, prefix{nullptr}, pos{nullptr};
  std::vector<int64_t> images_shape, weight_shape, prefix_shape, pos_shape;
  ONNXTensorElementDataType images_type = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
  ONNXTensorElementDataType weight_type = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
  ONNXTensorElementDataType prefix_type = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
  ONNXTensorElementDataType pos_type = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
};

inline OrtStatusPtr MakeEmbedStatus(OrtErrorCode code, const std::string& msg) {
  return MakeStatus(code, msg, kEmbedOpName);
}

EmbedValues ReadEmbedInputs(Ort::KernelContext& ctx);

// Checks ranks, shapes and element types of every input against Images [B, C, H, W] and `patch`, and that every
// element count (and its byte size) fits int64; fills dims. "" on success, else the error naming the input and
// the shapes.
std::string CheckEmbedInputs(const EmbedValues& v, int64_t patch, EmbedDims* dims);

// The patch attribute (required); throws when absent or < 1.
int64_t ReadEmbedPatch(const OrtKernelInfo* info);

// Shape inference: Out is [B, rows of Pos, N] float16.
OrtStatusPtr InferPatchEmbedShapes(OrtShapeInferContext* ctx) noexcept;

// One OrtCustomOp per (EP, image type): UNDEFINED (the CPU op) leaves the image type to the kernel's checks; a
// concrete type (the CUDA op: float, float16) makes ORT place other types elsewhere.
template <typename TKernel>
struct PatchEmbedOp : Ort::CustomOpBase<PatchEmbedOp<TKernel>, TKernel, /*WithStatus=*/true> {
  PatchEmbedOp(const char* provider, ONNXTensorElementDataType image_type)
      : provider_(provider), image_type_(image_type) {
    this->InferOutputShapeFn = [](const OrtCustomOp*, OrtShapeInferContext* ctx) -> OrtStatusPtr {
      return InferPatchEmbedShapes(ctx);
    };
  }

  OrtStatusPtr CreateKernelV2(const OrtApi&, const OrtKernelInfo* info, void** kernel) const {
    const std::string err = MissingInputError(info, kEmbedInputs, kEmbedNumInputs);
    if (!err.empty()) return MakeEmbedStatus(ORT_INVALID_ARGUMENT, err);
    try {
      *kernel = new TKernel(info);
    } catch (const std::exception& e) {
      return MakeEmbedStatus(ORT_INVALID_ARGUMENT, e.what());
    }
    return nullptr;
  }

  const char* GetName() const { return kEmbedOpName; }
  const char* GetExecutionProviderType() const { return provider_; }
  size_t GetInputTypeCount() const { return kEmbedNumInputs; }
  ONNXTensorElementDataType GetInputType(size_t i) const {
    if (i == kEmbedImages) return image_type_;
    return i == kEmbedWeight ? ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16 : ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
  }
  OrtCustomOpInputOutputCharacteristic GetInputCharacteristic(size_t) const { return InputCharacteristic(); }
  size_t GetOutputTypeCount() const { return 1; }
  ONNXTensorElementDataType GetOutputType(size_t) const { return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16; }
  OrtCustomOpInputOutputCharacteristic GetOutputCharacteristic(size_t) const { return INPUT_OUTPUT_REQUIRED; }

 private:
  const char* provider_;
  ONNXTensorElementDataType image_type_;
};

}  // namespace raggedvit

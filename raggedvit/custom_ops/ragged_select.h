// com.raggedvit::RaggedSelect v1: the index computation of one pruning stage in the capacity layout (DESIGN.md
// section 4): attributes, argument checks and the op definition shared by the CPU and CUDA kernels. No CUDA here.
//
//   scores [T]        float: score of each packed row (prefix rows ignored)
//   cu     [B+1]      int64, B >= 1: rows [cu[b], cu[b+1]) are image b, n_b = cu[b+1] - cu[b] <= width;
//                     rows past cu[B] are never read
//   src    [B*bound]  int64: source row of each output row (kept rows image by image in position order, then the
//                     other slots in slot order; padding slots: row 0)
//   cu_new [B+1]      int64: cu of the output rows (the kept counts)
//   seq_id [B*bound]  int64: image of the slot each output row copies
//   pos    [B*bound]  int64: position among its image's kept slots (0 before the first kept slot)
//   k      [B]        int64: patch rows kept per image, clamp(k, 1, P_b), P_b = n_b - num_prefix
//   attributes width (1..max(T, kSelectWidthFloor)), bound (0..width), num_prefix (>= 0, default 0), policy (0
//   count: k = ceil(P_b*keep); 1 mass: cls mass, DESIGN.md section 4 step 3), keep, mass (float in [0, 1], default
//   0: unset; the policy's own fraction in (0, 1]; another attribute type is refused)
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ragged_attention.h"  // ShapeString, ElementTypeName, CheckedMul, MakeStatus, GuardStatus, ReadIntAttr

namespace raggedvit {

constexpr const char* kSelectOpName = "RaggedSelect";
constexpr size_t kSelectScores = 0, kSelectCu = 1, kSelectNumInputs = 2;
constexpr InputSpec kSelectInputs[kSelectNumInputs] = {{"scores", true}, {"cu", true}};
constexpr size_t kSelectSrc = 0, kSelectCuNew = 1, kSelectSeqId = 2, kSelectPos = 3, kSelectK = 4,
                 kSelectNumOutputs = 5;
constexpr float kClsMassEps = 1e-30f;  // CLS_MASS_EPS of raggedvit/pruning/spec.py
// Largest width accepted beyond T: n_b <= T rows per image, so slots past T only pad, and the kernels' work and
// scratch grow with B * width (a width of 2^30 on one row took 1.1 GiB and 2.5 s before anything else ran).
// Every exported stage has T >= width (capacity layout: T = B * width).
constexpr int64_t kSelectWidthFloor = int64_t{1} << 16;

struct SelectAttrs {
  int64_t width = 0, bound = 0, num_prefix = 0, policy = 0;  // policy 0 count, 1 mass
  float keep = 0.0f, mass = 0.0f;
};

struct SelectDims {
  int64_t T = 0, B = 0;
  int64_t rows = 0;   // B * bound (output rows)
  int64_t slots = 0;  // B * width (padded slots; every slot index fits int64)
};

inline OrtStatusPtr MakeSelectStatus(OrtErrorCode code, const std::string& msg) {
  return MakeStatus(code, msg, kSelectOpName);
}

// Reads and checks the attributes; "" on success, else the error text.
std::string ReadSelectAttrs(const OrtKernelInfo* info, SelectAttrs* attrs);

// Checks ranks, element types, width <= max(T, kSelectWidthFloor) and that B*width, B*bound (and their byte sizes)
// fit int64; fills dims.
std::string CheckSelectInputs(const std::vector<int64_t>& scores_shape, ONNXTensorElementDataType scores_type,
                              const std::vector<int64_t>& cu_shape, ONNXTensorElementDataType cu_type,
                              const SelectAttrs& attrs, SelectDims* dims);

// Host check of the cu values (the CPU EP): 0 <= cu[0] <= ... <= cu[B] <= T and n_b <= width.
std::string CheckSelectCu(const int64_t* cu, const SelectDims& d, const SelectAttrs& attrs);

// Shape inference: src / seq_id / pos [B*bound], cu_new [B+1], k [B], all int64.
OrtStatusPtr InferRaggedSelectShapes(OrtShapeInferContext* ctx) noexcept;

template <typename TKernel>
struct RaggedSelectOp : Ort::CustomOpBase<RaggedSelectOp<TKernel>, TKernel, /*WithStatus=*/true> {
  explicit RaggedSelectOp(const char* provider) : provider_(provider) {
    this->InferOutputShapeFn = [](const OrtCustomOp*, OrtShapeInferContext* ctx) -> OrtStatusPtr {
      return InferRaggedSelectShapes(ctx);
    };
  }

  OrtStatusPtr CreateKernelV2(const OrtApi&, const OrtKernelInfo* info, void** kernel) const {
    std::string err = MissingInputError(info, kSelectInputs, kSelectNumInputs);
    if (!err.empty()) return MakeSelectStatus(ORT_INVALID_ARGUMENT, err);
    SelectAttrs attrs;
    err = ReadSelectAttrs(info, &attrs);
    if (!err.empty()) return MakeSelectStatus(ORT_INVALID_ARGUMENT, err);
    try {
      *kernel = new TKernel(attrs, info);
    } catch (const std::exception& e) {
      return MakeSelectStatus(ORT_FAIL, e.what());
    }
    return nullptr;
  }

  const char* GetName() const { return kSelectOpName; }
  const char* GetExecutionProviderType() const { return provider_; }
  size_t GetInputTypeCount() const { return kSelectNumInputs; }
  OrtCustomOpInputOutputCharacteristic GetInputCharacteristic(size_t) const { return InputCharacteristic(); }
  ONNXTensorElementDataType GetInputType(size_t i) const {
    return i == kSelectScores ? ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT : ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64;
  }
  size_t GetOutputTypeCount() const { return kSelectNumOutputs; }
  ONNXTensorElementDataType GetOutputType(size_t) const { return ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64; }

 private:
  const char* provider_;
};

}  // namespace raggedvit

// com.raggedvit::RaggedMerge v1: the merge of one tome stage (ToMe's bipartite soft matching and size-weighted
// average, DESIGN.md section 4) as one node. The one definition is raggedvit/pruning/merge.py
// (merge_tokens_reference); this header holds the attributes, argument checks, shape inference and the op definition
// shared by the CPU and CUDA kernels. No CUDA here.
//
//   x        [T, C]       float | float16 | bfloat16: the rows after the block's attention residual; T = B*n, image
//                         b the rows [b*n, (b+1)*n)
//   qkv      [T, 3*H*Dh]  x's type: the block's qkv (q | k | v, each H heads of Dh)
//   qkv_bias [3*H*Dh]     x's type (optional input): the qkv Linear's bias
//   size     [T]          float (optional input): tokens in each row (absent: every row 1)
//   cu       [B+1]        int64, B >= 1, cu[b] = b*n: the CPU EP checks the values on the host; the CUDA EP never
//                         reads them (n = T / B from the shapes)
//   skip     [T, C]       x's type (optional input): the block's attention branch; the rows merged are then
//                         x + (skip + skip_bias), each sum in float32 rounded to x's type (the two ONNX Adds the
//                         exporter folds in: merge.residual_rows), and prefix and kept rows are copied from that sum
//   skip_bias [C]         x's type (optional input, only with skip): the branch's bias (the proj Linear's)
//   attributes (int) num_heads (>= 1, required; qkv width a multiple of 3*num_heads), num_prefix (>= 0, <= n,
//   default 0: prefix rows never merge), r (>= 0, required: r_eff = min(r, (n - p) / 2) rows merge per image),
//   class_token (0 or 1, required: 1 keeps the unmerged A rows in position order, 0 in the matching's order)
//
//   x_out    [B*m, C]     x's type, m = n - r_eff: per image the prefix rows, the kept A rows, every B row in
//                         position order; a B row is (x_B s_B + sum x_a s_a) / (s_B + sum s_a), summed in float32
//                         and rounded to x's type once; prefix and kept rows are copied unchanged
//   size_out [B*m]        float: s_B + sum s_a for B rows, the input size otherwise
//   cu_out   [B+1]        int64: b*m
//   src      [B*m]        int64: the input row (b*n + position) each output row is named after
//   key_bias [B*m]        float: log(size_out) (the next block's proportional attention)
//   score    [B*n_A]      float: each A row's best cosine similarity to B, A order (-inf for all when n_B == 0)
//
// The metric: the k part of qkv (+ qkv_bias's k part), in float32, summed over the H heads then / H: [T, Dh]; each
// row normalised by max(||m||_2, kMergeMetricEps). Sets: A = positions a0, a0+2, ... < n, B = b0, b0+2, ... < n.
// Each A row's best B row: the highest cosine, ties the lowest B index. The r_eff A rows merged: a stable descending
// sort of the A rows by score (ties: the lower A index first), the first r_eff.
//
// For a CUDA kernel: CheckMergeInputs reads shapes and types only (no device data) and fills every size it needs in
// MergeDims (T, B, n, m, C, H, Dh, n_A, n_B, r_eff, a0, b0, all checked against int64 overflow together with their
// float32 byte sizes, including the per-image score matrix n_A x n_B); MergeAttrs carries class_token and
// num_prefix. The merged B sums must be deterministic (same input, same bits: no atomics on the sums).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ragged_attention.h"  // ShapeString, ElementTypeName, CheckedMul, MakeStatus, GuardStatus, FreshSymbol

namespace raggedvit {

constexpr const char* kMergeOpName = "RaggedMerge";

// Input positions.
constexpr size_t kMergeX = 0, kMergeQkv = 1, kMergeQkvBias = 2, kMergeSize = 3, kMergeCu = 4, kMergeSkip = 5,
                 kMergeSkipBias = 6, kMergeNumInputs = 7;
constexpr InputSpec kMergeInputs[kMergeNumInputs] = {{"x", true},   {"qkv", true},  {"qkv_bias", false},
                                                     {"size", false}, {"cu", true}, {"skip", false},
                                                     {"skip_bias", false}};
// Output positions.
constexpr size_t kMergeXOut = 0, kMergeSizeOut = 1, kMergeCuOut = 2, kMergeSrc = 3, kMergeKeyBias = 4,
                 kMergeScore = 5, kMergeNumOutputs = 6;

constexpr float kMergeMetricEps = 1e-12f;  // METRIC_EPS of raggedvit/pruning/merge.py

struct MergeAttrs {
  int64_t num_heads = 0, num_prefix = 0, r = 0;
  bool class_token = true;
};

struct MergeDims {
  int64_t T = 0, B = 0, n = 0;  // T = B*n input rows, n per image
  int64_t m = 0;                // n - r_eff output rows per image
  int64_t C = 0;                // x's width
  int64_t H = 0, Dh = 0;        // heads, head dim: qkv width 3*H*Dh; the metric is [T, Dh]
  int64_t n_A = 0, n_B = 0;     // sizes of sets A and B per image
  int64_t r_eff = 0;            // A rows merged per image: min(r, (n - p) / 2)
  int64_t a0 = 0, b0 = 0;       // first positions of A and B: p + p%2, p + 1 - p%2
};

// Shapes and element types of the inputs of one call (has_* false: the optional input is absent).
struct MergeInputs {
  std::vector<int64_t> x, qkv, qkv_bias, size, cu, skip, skip_bias;
  ONNXTensorElementDataType x_type = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
  ONNXTensorElementDataType qkv_type = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
  ONNXTensorElementDataType qkv_bias_type = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
  ONNXTensorElementDataType size_type = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
  ONNXTensorElementDataType cu_type = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
  ONNXTensorElementDataType skip_type = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
  ONNXTensorElementDataType skip_bias_type = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
  bool has_qkv_bias = false, has_size = false, has_skip = false, has_skip_bias = false;
};

// The inputs of a kernel call (ctx must outlive the returned values).
struct MergeValues {
  Ort::ConstValue x{nullptr}, qkv{nullptr}, qkv_bias{nullptr}, size{nullptr}, cu{nullptr}, skip{nullptr},
      skip_bias{nullptr};
  MergeInputs info;
};

inline OrtStatusPtr MakeMergeStatus(OrtErrorCode code, const std::string& msg) {
  return MakeStatus(code, msg, kMergeOpName);
}

// merged_count and merge_widths of raggedvit/pruning/merge.py (0 <= p <= n): r_eff, and (a0, b0, n_A, n_B).
inline int64_t MergedCount(int64_t n, int64_t p, int64_t r) {
  const int64_t half = (n - p) / 2;
  return r < half ? r : half;
}
inline void MergeSets(int64_t n, int64_t p, int64_t* a0, int64_t* b0, int64_t* n_A, int64_t* n_B) {
  *a0 = p + p % 2;
  *b0 = p + 1 - p % 2;
  *n_A = *a0 > n ? 0 : (n - *a0 + 1) / 2;
  *n_B = *b0 > n ? 0 : (n - *b0 + 1) / 2;
}

// Reads and checks the attributes; "" on success, else the error text naming the attribute.
std::string ReadMergeAttrs(const OrtKernelInfo* info, MergeAttrs* attrs);

// Reads the inputs of a call (absent optional inputs stay null).
MergeValues ReadMergeInputs(Ort::KernelContext& ctx);

// Checks ranks and element types (x float, float16 or bfloat16; qkv, qkv_bias, skip and skip_bias x's type; size
// float; cu int64), shapes (qkv [T, 3*H*Dh] with Dh >= 1, qkv_bias [3*H*Dh], size [T], cu [B+1] with B >= 1 and
// T % B == 0, skip [T, C], skip_bias [C] and only with skip),
// num_prefix <= n, and that every element count and its float32 byte size fits int64; fills dims. "" on success, else
// the error text naming the input or attribute and the shapes. Reads no tensor data (any EP).
std::string CheckMergeInputs(const MergeInputs& in, const MergeAttrs& attrs, MergeDims* dims);

// Host check of the cu values (the CPU EP): cu[b] == b*n for every b.
std::string CheckMergeCu(const int64_t* cu, const MergeDims& d);

// Shape inference: x_out [B*m, C] of x's type, size_out / key_bias / src [B*m], cu_out [B+1], score [B*n_A] when T,
// B (and C) are static and the attributes valid; unknown dims otherwise (the kernel reports what is wrong).
OrtStatusPtr InferRaggedMergeShapes(OrtShapeInferContext* ctx) noexcept;

// One OrtCustomOp per (EP, data type): data type UNDEFINED (the CPU op) leaves the types of x, qkv, qkv_bias, skip
// and skip_bias to CheckMergeInputs (ORT types x_out after the last of them given and refuses a graph declaring x_out
// otherwise; any other mix reaches the op); a concrete type (a CUDA op per float16 / bfloat16) makes ORT place other types
// elsewhere. size is declared float and cu int64 (ORT refuses other types at session creation, naming the input).
template <typename TKernel>
struct RaggedMergeOp : Ort::CustomOpBase<RaggedMergeOp<TKernel>, TKernel, /*WithStatus=*/true> {
  RaggedMergeOp(const char* provider, ONNXTensorElementDataType data_type)
      : provider_(provider), data_type_(data_type) {
    this->InferOutputShapeFn = [](const OrtCustomOp*, OrtShapeInferContext* ctx) -> OrtStatusPtr {
      return InferRaggedMergeShapes(ctx);
    };
  }

  OrtStatusPtr CreateKernelV2(const OrtApi&, const OrtKernelInfo* info, void** kernel) const {
    std::string err = MissingInputError(info, kMergeInputs, kMergeNumInputs);
    if (!err.empty()) return MakeMergeStatus(ORT_INVALID_ARGUMENT, err);
    MergeAttrs attrs;
    err = ReadMergeAttrs(info, &attrs);
    if (!err.empty()) return MakeMergeStatus(ORT_INVALID_ARGUMENT, err);
    try {
      *kernel = new TKernel(attrs, info);
    } catch (const std::exception& e) {
      return MakeMergeStatus(ORT_FAIL, e.what());
    }
    return nullptr;
  }

  const char* GetName() const { return kMergeOpName; }
  const char* GetExecutionProviderType() const { return provider_; }
  size_t GetInputTypeCount() const { return kMergeNumInputs; }
  ONNXTensorElementDataType GetInputType(size_t i) const {
    if (i == kMergeSize) return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;  // skip and skip_bias: x's type
    return i == kMergeCu ? ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64 : data_type_;
  }
  OrtCustomOpInputOutputCharacteristic GetInputCharacteristic(size_t) const { return InputCharacteristic(); }
  size_t GetOutputTypeCount() const { return kMergeNumOutputs; }
  ONNXTensorElementDataType GetOutputType(size_t i) const {
    if (i == kMergeXOut) return data_type_;
    return i == kMergeCuOut || i == kMergeSrc ? ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64
                                              : ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
  }
  OrtCustomOpInputOutputCharacteristic GetOutputCharacteristic(size_t) const { return INPUT_OUTPUT_REQUIRED; }

 private:
  const char* provider_;
  ONNXTensorElementDataType data_type_;
};

}  // namespace raggedvit

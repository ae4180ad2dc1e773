// com.raggedvit::RaggedAttention v1: attributes, argument checks and the op definition shared by the
// CPU and CUDA kernels (DESIGN.md section 3). No CUDA here.
//
//   qkv        [T, 3*H*D] float16 | float | bfloat16 (row t = q heads | k heads | v heads)
//   cu_seqlens [B+1] int32 | int64, 0 = cu[0] <= ... <= cu[B] <= T (rows >= cu[B] are dead: zero outputs)
//   bias       [3*H*D] qkv's type (optional input): the qkv Linear's bias, added to q, k, v on load
//   pos_table  [H, R] float (optional input, with token_pos): relative position bias table,
//              R = (2*grid_h-1)*(2*grid_w-1) + 3 (attributes grid_h, grid_w, num_prefix)
//   token_pos  [T] int32 | int64, cu_seqlens's type (optional input, with pos_table): each row's original token index;
//              logit(q, k) += pos_table[h, RelIndex(token_pos[q], token_pos[k])] (DESIGN.md section 3)
//   key_bias   [T] float (optional input): logit(q, k) += key_bias[k] in every head (ToMe's proportional attention,
//              log(size)); cls_attn uses the same biased logits
//   out        [T, H*D] same type as qkv
//   cls_attn   [T] float (optional output)
#pragma once

#include <cmath>
#include <cstdint>
#include <exception>
#include <string>
#include <vector>

#include "onnxruntime_cxx_api.h"
#include "op_checks.h"  // CheckedMul, CheckedAdd, CheckedSize, ReadIntAttr, ReadFloatAttr

namespace raggedvit {

constexpr const char* kDomain = "com.raggedvit";
constexpr const char* kOpName = "RaggedAttention";

struct Attrs {
  int64_t num_heads = 0;
  float scale = 0.0f;  // 0 -> 1/sqrt(D)
  bool has_scale = false;
  int64_t max_seqlen = -1;  // -1 -> unbounded
  int64_t grid_h = 0, grid_w = 0, num_prefix = 0;  // relative position bias (0: no grid)
  int64_t pos_size = 0;    // R = (2*grid_h-1)*(2*grid_w-1) + 3 when grid_h, grid_w >= 1, else 0
  int64_t patch_end = 0;   // num_prefix + grid_h*grid_w: token indices in [num_prefix, patch_end) are patches
};

// Input positions of the optional inputs.
constexpr size_t kBiasInput = 2, kPosTableInput = 3, kTokenPosInput = 4, kKeyBiasInput = 5, kNumInputs = 6;
constexpr InputSpec kInputs[kNumInputs] = {{"qkv", true},       {"cu_seqlens", true}, {"bias", false},
                                           {"pos_table", false}, {"token_pos", false}, {"key_bias", false}};

struct Dims {
  int64_t T = 0, B = 0, H = 0, D = 0;
};

// Largest num_heads for which 3*num_heads fits int64 (ReadAttrs refuses more).
constexpr int64_t kMaxNumHeads = INT64_MAX / 3;

std::string ShapeString(const std::vector<int64_t>& shape);
const char* ElementTypeName(ONNXTensorElementDataType type);

// Reads and checks the node attributes; "" on success, else the error text.
std::string ReadAttrs(const OrtKernelInfo* info, Attrs* attrs);

// Checks ranks and widths; fills dims. "" on success, else the error text naming argument and shapes.
std::string CheckShapes(const std::vector<int64_t>& qkv_shape, const std::vector<int64_t>& cu_shape,
                        int64_t num_heads, Dims* dims);

// Checks the optional bias input against qkv: 1-D [3*H*D], qkv's element type. "" when fine.
std::string CheckBias(const std::vector<int64_t>& bias_shape, ONNXTensorElementDataType bias_type,
                      const std::vector<int64_t>& qkv_shape, ONNXTensorElementDataType qkv_type);

// Checks the optional relative position inputs (both present or both absent; shapes [num_heads, R] float and
// [T] of cu_seqlens's type; attributes grid_h, grid_w >= 1). "" when fine.
std::string CheckPos(bool has_table, const std::vector<int64_t>& table_shape, ONNXTensorElementDataType table_type,
                     bool has_token_pos, const std::vector<int64_t>& token_pos_shape,
                     ONNXTensorElementDataType token_pos_type, ONNXTensorElementDataType cu_type,
                     const std::vector<int64_t>& qkv_shape, const Attrs& attrs);

// Reads the optional inputs pos_table and token_pos of a kernel call and checks them (CheckPos); *table and
// *token_pos get their data (nullptr when absent). "" when fine.
std::string ReadPosInputs(Ort::KernelContext& ctx, const Attrs& attrs, const std::vector<int64_t>& qkv_shape,
                          ONNXTensorElementDataType cu_type, const void** table, const void** token_pos);

// Checks the optional key_bias input against qkv: 1-D [T] float. "" when fine.
std::string CheckKeyBias(const std::vector<int64_t>& key_bias_shape, ONNXTensorElementDataType key_bias_type,
                         const std::vector<int64_t>& qkv_shape);

// Reads the optional input key_bias of a kernel call and checks it (CheckKeyBias); *key_bias gets its data (nullptr
// when absent). "" when fine.
std::string ReadKeyBias(Ort::KernelContext& ctx, const std::vector<int64_t>& qkv_shape, const float** key_bias);

// Relative position of one (query, key) pair from the rows' precomputed codes (RelCode): the table column.
// A patch row has code.patch = 1, base = (y+grid_h-1)*(2*grid_w-1) + x+grid_w-1 and off = y*(2*grid_w-1) + x;
// the pair's column is q.base - k.off for two patch rows, else R-1 - q.patch - 2*k.patch (R-1 class->class,
// R-2 patch->class, R-3 class->patch). Always in [0, R).
struct RelCode {
  int64_t base = 0, off = 0;
  int64_t patch = 0;
};

template <typename I>
inline RelCode MakeRelCode(I token, const Attrs& a) {
  const int64_t t = static_cast<int64_t>(token);
  RelCode c;
  if (t >= a.num_prefix && t < a.patch_end) {
    const int64_t rel = t - a.num_prefix, y = rel / a.grid_w, x = rel % a.grid_w, w2 = 2 * a.grid_w - 1;
    c.patch = 1;
    c.base = (y + a.grid_h - 1) * w2 + x + a.grid_w - 1;
    c.off = y * w2 + x;
  }
  return c;
}

inline int64_t RelColumn(const RelCode& q, const RelCode& k, int64_t pos_size) {
  return (q.patch & k.patch) ? q.base - k.off : pos_size - 1 - q.patch - 2 * k.patch;
}

// Host-side check of the cu_seqlens values (CPU EP only; the CUDA kernel clamps them instead).
template <typename I>
std::string CheckCuValues(const I* cu, const Dims& d, const Attrs& attrs, const std::vector<int64_t>& qkv_shape) {
  const int64_t n = d.B + 1;
  const std::string where = "input 'cu_seqlens' (shape [" + std::to_string(n) + "], qkv shape " +
                            ShapeString(qkv_shape) + ")";
  if (static_cast<int64_t>(cu[0]) != 0) {
    return where + " must start at 0, got cu_seqlens[0] = " + std::to_string(static_cast<int64_t>(cu[0]));
  }
  for (int64_t b = 0; b < d.B; ++b) {
    const int64_t lo = static_cast<int64_t>(cu[b]), hi = static_cast<int64_t>(cu[b + 1]);
    if (hi < lo) {
      return where + " must be non-decreasing, got cu_seqlens[" + std::to_string(b + 1) + "] = " +
             std::to_string(hi) + " < cu_seqlens[" + std::to_string(b) + "] = " + std::to_string(lo);
    }
    if (hi > d.T) {
      return where + ": cu_seqlens[" + std::to_string(b + 1) + "] = " + std::to_string(hi) +
             " exceeds T = " + std::to_string(d.T);
    }
    if (attrs.max_seqlen >= 0 && hi - lo > attrs.max_seqlen) {
      return where + ": sequence " + std::to_string(b) + " has length " + std::to_string(hi - lo) +
             " above attribute max_seqlen = " + std::to_string(attrs.max_seqlen);
    }
  }
  return "";  // cu[B] <= T: rows [cu[B], T) are dead (the capacity layout; the kernels zero their outputs)
}

// An ORT status "<op>: <msg>" (op: the reporting op's name).
inline OrtStatusPtr MakeStatus(OrtErrorCode code, const std::string& msg, const char* op = kOpName) {
  const std::string text = std::string(op) + ": " + msg;
  return Ort::GetApi().CreateStatus(code, text.c_str());
}

// A process-unique symbolic dimension ("ragged_dim_<n>") for shape inference; lives as long as the library.
Ort::ShapeInferContext::SymbolicInteger FreshSymbol();

// Shape inference shared by every registration: out [T, W/3], cls_attn [T].
OrtStatusPtr InferRaggedAttentionShapes(OrtShapeInferContext* ctx) noexcept;

// One OrtCustomOp per (EP, cu_seqlens type, token_pos type); qkv is declared UNDEFINED so that the kernel validates its
// element type itself (and ORT infers out's type from qkv's).
template <typename TKernel>
struct RaggedAttentionOp : Ort::CustomOpBase<RaggedAttentionOp<TKernel>, TKernel, /*WithStatus=*/true> {
  // token_pos_type: every int type pair is registered so that a token_pos of the other int type reaches the kernel,
  // whose check names the input and the type it must have (instead of ORT's "no kernel def matches").
  RaggedAttentionOp(const char* provider, ONNXTensorElementDataType cu_type, ONNXTensorElementDataType token_pos_type)
      : provider_(provider), cu_type_(cu_type), token_pos_type_(token_pos_type) {
    this->InferOutputShapeFn = [](const OrtCustomOp*, OrtShapeInferContext* ctx) -> OrtStatusPtr {
      return InferRaggedAttentionShapes(ctx);
    };
  }

  OrtStatusPtr CreateKernelV2(const OrtApi&, const OrtKernelInfo* info, void** kernel) const {
    std::string err = MissingInputError(info, kInputs, kNumInputs);
    if (!err.empty()) return MakeStatus(ORT_INVALID_ARGUMENT, err);
    Attrs attrs;
    err = ReadAttrs(info, &attrs);
    if (!err.empty()) return MakeStatus(ORT_INVALID_ARGUMENT, err);
    try {
      *kernel = new TKernel(attrs, info);
    } catch (const std::exception& e) {
      return MakeStatus(ORT_FAIL, e.what());
    }
    return nullptr;
  }

  const char* GetName() const { return kOpName; }
  const char* GetExecutionProviderType() const { return provider_; }
  size_t GetInputTypeCount() const { return kNumInputs; }
  // qkv, bias: UNDEFINED (one type constraint, checked by the kernel); pos_table, key_bias float (ORT refuses another
  // type at session creation, naming the input: an UNDEFINED key_bias would join qkv's type constraint); token_pos
  // int32 | int64
  ONNXTensorElementDataType GetInputType(size_t i) const {
    if (i == 1) return cu_type_;
    if (i == kTokenPosInput) return token_pos_type_;
    return i == kPosTableInput || i == kKeyBiasInput ? ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT
                                                     : ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
  }
  OrtCustomOpInputOutputCharacteristic GetInputCharacteristic(size_t) const { return InputCharacteristic(); }
  size_t GetOutputTypeCount() const { return 2; }
  ONNXTensorElementDataType GetOutputType(size_t i) const {
    return i == 0 ? ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED : ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
  }
  OrtCustomOpInputOutputCharacteristic GetOutputCharacteristic(size_t i) const {
    return i == 0 ? INPUT_OUTPUT_REQUIRED : INPUT_OUTPUT_OPTIONAL;
  }

 private:
  const char* provider_;
  ONNXTensorElementDataType cu_type_;
  ONNXTensorElementDataType token_pos_type_;
};

// Runs f() and turns any escaping exception into an ORT status (named after op).
template <typename F>
OrtStatusPtr GuardStatus(F&& f, const char* op = kOpName) noexcept {
  try {
    return f();
  } catch (const Ort::Exception& e) {
    return Ort::GetApi().CreateStatus(e.GetOrtErrorCode(), e.what());
  } catch (const std::exception& e) {
    return MakeStatus(ORT_FAIL, e.what(), op);
  } catch (...) {
    return MakeStatus(ORT_FAIL, "unknown C++ exception", op);
  }
}

}  // namespace raggedvit

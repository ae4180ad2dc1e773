// The checks every com.raggedvit op shares: overflow-checked int64 sizes and a typed, range-checked attribute
// reader. Header-only, no CUDA. Errors are returned as text ("" on success) naming the attribute or the sizes; the
// op prefixes its name when it turns the text into an ORT status.
#pragma once

#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "onnxruntime_cxx_api.h"

namespace raggedvit {

// ---- sizes -------------------------------------------------------------------------------------------------------

// Overflow-checked int64 arithmetic: false (and *out untouched) when the exact result does not fit.
inline bool CheckedMul(int64_t a, int64_t b, int64_t* out) {
  int64_t r = 0;
  if (__builtin_mul_overflow(a, b, &r)) return false;
  *out = r;
  return true;
}
inline bool CheckedAdd(int64_t a, int64_t b, int64_t* out) {
  int64_t r = 0;
  if (__builtin_add_overflow(a, b, &r)) return false;
  *out = r;
  return true;
}

// The element count of a buffer with dimensions `dims` (each >= 0): true, and *elements set, when every dimension
// is non-negative and every partial product, including the product of the non-zero dimensions alone and the byte
// size elements * elem_bytes, fits int64. Checking the non-zero product too means a zero dimension cannot hide an
// overflowing pair of others (a derived count such as the patch grid gh * gw is then in range as well).
template <typename Dims>
inline bool CheckedSizeOf(const Dims& dims, int64_t elem_bytes, int64_t* elements) {
  int64_t n = 1, nonzero = 1, bytes = 0;
  for (int64_t d : dims) {
    if (d < 0 || !CheckedMul(n, d, &n)) return false;
    if (d != 0 && !CheckedMul(nonzero, d, &nonzero)) return false;
  }
  if (!CheckedMul(n, elem_bytes, &bytes) || !CheckedMul(nonzero, elem_bytes, &bytes)) return false;
  if (elements != nullptr) *elements = n;
  return true;
}
inline bool CheckedSize(std::initializer_list<int64_t> dims, int64_t elem_bytes, int64_t* elements = nullptr) {
  return CheckedSizeOf(dims, elem_bytes, elements);
}
inline bool CheckedSize(const std::vector<int64_t>& dims, int64_t elem_bytes, int64_t* elements = nullptr) {
  return CheckedSizeOf(dims, elem_bytes, elements);
}

// ---- attributes --------------------------------------------------------------------------------------------------

// Low-level probes: true and *out set when the node has attribute `name` of that type; false (no status leaked)
// when it is absent or of another type. Ops read attributes through ReadIntAttr / ReadFloatAttr below, which add
// the type and range checks.
inline bool TryAttrInt(const OrtKernelInfo* info, const char* name, int64_t* out) {
  OrtStatus* st = Ort::GetApi().KernelInfoGetAttribute_int64(info, name, out);
  if (st == nullptr) return true;
  Ort::GetApi().ReleaseStatus(st);
  return false;
}
inline bool TryAttrFloat(const OrtKernelInfo* info, const char* name, float* out) {
  OrtStatus* st = Ort::GetApi().KernelInfoGetAttribute_float(info, name, out);
  if (st == nullptr) return true;
  Ort::GetApi().ReleaseStatus(st);
  return false;
}

// The type a node gives attribute `name` ("absent" when the node has none of that name).
inline const char* AttrTypeName(const OrtKernelInfo* info, const char* name) {
  const OrtApi& api = Ort::GetApi();
  auto ok = [&api](OrtStatus* st) {
    if (st == nullptr) return true;
    api.ReleaseStatus(st);
    return false;
  };
  int64_t i = 0;
  float f = 0.0f;
  size_t size = 0;
  if (TryAttrInt(info, name, &i)) return "int";
  if (TryAttrFloat(info, name, &f)) return "float";
  if (ok(api.KernelInfoGetAttribute_string(info, name, nullptr, &size))) return "string";
  size = 0;
  if (ok(api.KernelInfoGetAttributeArray_int64(info, name, nullptr, &size))) return "ints";
  size = 0;
  if (ok(api.KernelInfoGetAttributeArray_float(info, name, nullptr, &size))) return "floats";
  OrtAllocator* alloc = nullptr;
  OrtValue* tensor = nullptr;
  if (ok(api.GetAllocatorWithDefaultOptions(&alloc)) &&
      ok(api.KernelInfoGetAttribute_tensor(info, name, alloc, &tensor))) {
    api.ReleaseValue(tensor);
    return "tensor";
  }
  return "absent";
}

inline std::string WithArticle(const std::string& type) {
  return (type == "int" || type == "ints" ? "an " : "a ") + type;
}

inline std::string AttrNumber(double v) {
  std::ostringstream s;
  s.precision(9);
  s << v;
  return s.str();
}

// Reads int attribute `name` into *out, which holds the default when the node has none (then "" unless
// `required`). Refuses another type (a float 'num_heads' would otherwise be ignored silently) and a value outside
// [lo, hi].
inline std::string ReadIntAttr(const OrtKernelInfo* info, const char* name, int64_t lo, int64_t hi, int64_t* out,
                               bool required = false) {
  const std::string attr = std::string("attribute '") + name + "'";
  const std::string type = AttrTypeName(info, name);
  if (type == "absent") return required ? attr + " (int) is required" : "";
  if (type != "int") {
    float f = 0.0f;
    const bool is_float = type == "float" && TryAttrFloat(info, name, &f);
    return attr + " must be an int, got " + WithArticle(type) + (is_float ? " (" + AttrNumber(f) + ")" : "");
  }
  int64_t v = 0;
  TryAttrInt(info, name, &v);
  if (v < lo || v > hi) {
    const std::string want = hi == std::numeric_limits<int64_t>::max()
                                 ? ">= " + std::to_string(lo)
                                 : "in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
    return attr + " must be " + want + ", got " + std::to_string(v);
  }
  *out = v;
  return "";
}

// Reads float attribute `name` into *out (the default when absent; "" unless `required`). Refuses another type (an
// int 'epsilon' would otherwise be ignored silently), NaN and infinities, and a value outside the interval from lo
// to hi (open at lo with lo_open, at hi with hi_open).
inline std::string ReadFloatAttr(const OrtKernelInfo* info, const char* name, float lo, float hi, float* out,
                                 bool lo_open = false, bool hi_open = false, bool required = false) {
  const std::string attr = std::string("attribute '") + name + "'";
  const std::string type = AttrTypeName(info, name);
  if (type == "absent") return required ? attr + " (float) is required" : "";
  if (type != "float") {
    int64_t i = 0;
    const bool is_int = type == "int" && TryAttrInt(info, name, &i);
    return attr + " must be a float, got " + WithArticle(type) + (is_int ? " (" + std::to_string(i) + ")" : "");
  }
  float v = 0.0f;
  TryAttrFloat(info, name, &v);
  const bool above = lo_open ? v > lo : v >= lo;
  const bool below = hi_open ? v < hi : v <= hi;
  if (!std::isfinite(v) || !above || !below) {
    std::string want;
    if (lo <= -std::numeric_limits<float>::max() && hi >= std::numeric_limits<float>::max()) {
      want = "a finite float";
    } else if (hi >= std::numeric_limits<float>::max()) {
      want = std::string("a finite float ") + (lo_open ? "> " : ">= ") + AttrNumber(lo);
    } else {
      want = std::string("a finite float in ") + (lo_open ? "(" : "[") + AttrNumber(lo) + ", " + AttrNumber(hi) +
             (hi_open ? ")" : "]");
    }
    return attr + " must be " + want + ", got " + AttrNumber(v);
  }
  *out = v;
  return "";
}

// ---- inputs ------------------------------------------------------------------------------------------------------

// One formal input of an op: its name and whether a node must give it.
struct InputSpec {
  const char* name;
  bool required;
};

// ORT builds an op's ONNX schema from GetInputCharacteristic (onnxruntime/core/session/custom_ops.cc, CreateSchema:
// the inputs are named "Input0", "Input1", ...) and ONNX checks every node against it before any op code runs
// (onnx/defs/schema.cc, OpSchema::Verify): a required input left out or given as "" would be refused by its index
// ("has input size 1 not in range [min=2, max=2]", "input 1 is marked single but has an empty string"). So every
// com.raggedvit op declares all its inputs optional (InputCharacteristic) and refuses a missing required one itself
// at kernel creation, by name (MissingInputError). An input past the declared count stays ONNX's to refuse
// (DESIGN.md section 3).
inline OrtCustomOpInputOutputCharacteristic InputCharacteristic() { return INPUT_OUTPUT_OPTIONAL; }

// "" when the node of `info` gives every required input of `specs` (count of them, in order); else the text that
// names the first missing one and the inputs the op takes.
inline std::string MissingInputError(const OrtKernelInfo* info, const InputSpec* specs, size_t count) {
  Ort::ConstKernelInfo ki(info);
  const size_t given = ki.GetInputCount();
  for (size_t i = 0; i < count; ++i) {
    if (!specs[i].required || (i < given && !ki.GetInputName(i).empty())) continue;
    std::string takes;
    for (size_t j = 0; j < count; ++j) {
      takes += (j ? ", " : "") + std::string(specs[j].name) + (specs[j].required ? "" : " (optional)");
    }
    const std::string why = i < given ? "is an empty name" : "is missing (the node gives " + std::to_string(given) +
                                                                 " of the " + std::to_string(count) + " inputs)";
    return std::string("required input '") + specs[i].name + "' (input " + std::to_string(i) + ") " + why +
           "; give the node its inputs in this order: " + takes;
  }
  return "";
}

constexpr float kFloatMax = std::numeric_limits<float>::max();
constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();

}  // namespace raggedvit

// Element conversions of the CPU kernels: float / float16 / bfloat16 to float and back (one rounding).
#pragma once

#include "../ragged_attention.h"  // the ORT C++ API (Ort::Float16_t, Ort::BFloat16_t)

namespace raggedvit {

inline float ToFloat(float x) { return x; }
inline float ToFloat(Ort::Float16_t x) { return x.ToFloat(); }
inline float ToFloat(Ort::BFloat16_t x) { return x.ToFloat(); }

template <typename T>
inline T FromFloat(float x) {
  return T(x);
}
template <>
inline float FromFloat<float>(float x) {
  return x;
}

}  // namespace raggedvit

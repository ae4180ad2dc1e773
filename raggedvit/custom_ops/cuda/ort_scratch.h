// Shared by the ORT-facing CUDA kernels: device scratch from ORT's allocator, and ORT element types as the
// launchers' DType.
#pragma once

#include "../ragged_attention.h"  // the ORT C++ API
#include "launcher.h"

namespace raggedvit {

// Stream-ordered device scratch from ORT's allocator of the given memory, freed at scope exit.
struct Scratch {
  OrtAllocator* allocator = nullptr;
  void* ptr = nullptr;
  Scratch() = default;
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  ~Scratch() {
    if (allocator != nullptr) {
      if (ptr != nullptr) allocator->Free(allocator, ptr);
      Ort::GetApi().ReleaseAllocator(allocator);
    }
  }
};

// float / float16 / bfloat16 -> the launchers' DType; false for any other element type.
inline bool ToLaunchType(ONNXTensorElementDataType t, cuda::DType* out) {
  switch (t) {
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT: *out = cuda::DType::kFloat32; return true;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16: *out = cuda::DType::kFloat16; return true;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16: *out = cuda::DType::kBFloat16; return true;
    default: return false;
  }
}

}  // namespace raggedvit

// Internal to the launchers (launcher.cc, linear_launcher.cc): the CUDA context, module cache and launch path
// they share. No ORT types; cuda.h (types only) comes from the triton wheel.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "cuda.h"
#include "launcher.h"

namespace raggedvit::cuda {

// What the module cache needs of a table row (KernelImage or LinearImage).
struct CubinRef {
  const unsigned char* cubin;
  const char* function_name;
  int shared_bytes;
};

// Pops the context EnterContext pushed, if it pushed one (pushed is set by EnterContext only).
struct LaunchScope {
  LaunchScope() = default;
  LaunchScope(const LaunchScope&) = delete;
  LaunchScope& operator=(const LaunchScope&) = delete;
  ~LaunchScope();
  bool pushed = false;
};

// Loads a cubin's function once per context (opting in to its shared memory); "" on success.
using LoadFn = std::function<std::string(const CubinRef&, CUfunction*)>;
// Chooses images for the device's arch (major*10 + minor) and loads them through `load`; "" on success.
using PickFn = std::function<std::string(int arch, const LoadFn& load)>;

// "" when libcuda loaded and a device exists, else why not.
std::string DriverError();

// Under the launcher lock: makes the context of `stream` (or the primary context of device_ordinal for a null
// stream) current until `scope` ends, then runs pick. "" on success, else the error text.
std::string EnterContext(void* stream, int device_ordinal, LaunchScope& scope, const PickFn& pick);

// cuLaunchKernel of a (grid_x, grid_y, 1) grid of 32*num_warps threads; "" or the error naming `what`.
std::string Launch(CUfunction fn, unsigned grid_x, unsigned grid_y, int num_warps, int shared_bytes, void* stream,
                   void** args, const char* what);

// Multiprocessors of the current context's device (call inside a PickFn: the context is current); "" on success.
std::string CurrentMultiprocessorCount(int* count);

// cuTensorMapEncodeTiled of a row-major [rows, cols] matrix of 2-byte elements at `base` (16-byte aligned, cols * 2
// a multiple of 16) in boxes of box_rows x box_cols (box_cols * 2 = 128 bytes): 128-byte swizzle, out-of-bounds
// reads as zeros and stores clipped; "" on success, else the error naming `what`.
std::string EncodeTmaTiled2D(CUtensorMap* map, CUtensorMapDataType type, const void* base, uint64_t cols,
                             uint64_t rows, uint32_t box_cols, uint32_t box_rows, const char* what);

// "fp32" | "fp16" | "bf16".
const char* DTypeName(DType t);

}  // namespace raggedvit::cuda

// Launcher of the AOT-compiled gather + LayerNorm kernel (raggedvit/kernels/_norm_kernel.py:_gather_layer_norm):
// the image of the device's arch (same major, highest minor <= the device's) and the CuSeqlens type with the
// smallest BLOCK_D >= D, then the context / module cache / cuLaunchKernel path shared with the other launchers
// (launch_context.h). One launch; the live count cu[B] is read by the kernel, never on the host.
#include <cstdint>
#include <string>

#include "launch_context.h"
#include "launcher.h"

namespace raggedvit::cuda {

namespace {

constexpr int64_t kInt32Limit = int64_t{1} << 31;  // the kernel takes T, R, D, B and its program id as int32
// rows of the last program (pid * BLOCK_R + arange, BLOCK_R <= 8) are int32 in the kernel too
constexpr int64_t kMaxRows = kInt32Limit - 64;

long PickNormImage(const NormLaunch& n, int arch) {
  long best = -1;
  for (size_t i = 0; i < kNumNormImages; ++i) {
    const NormImage& im = kNormImages[i];
    if (im.dtype != n.dtype || im.index_type != n.index_type || im.block_d < n.D) continue;
    if (im.arch / 10 != arch / 10 || im.arch > arch) continue;
    if (best < 0) {
      best = static_cast<long>(i);
      continue;
    }
    const NormImage& b = kNormImages[best];
    if (im.block_d < b.block_d || (im.block_d == b.block_d && im.arch > b.arch)) best = static_cast<long>(i);
  }
  return best;
}

int MaxBlockD(DType dtype) {
  int widest = 0;
  for (size_t i = 0; i < kNumNormImages; ++i) {
    if (kNormImages[i].dtype == dtype && kNormImages[i].block_d > widest) widest = kNormImages[i].block_d;
  }
  return widest;
}

std::string Sizes(const NormLaunch& n) {
  return "T = " + std::to_string(n.T) + ", R = " + std::to_string(n.R) + ", D = " + std::to_string(n.D) +
         ", B = " + std::to_string(n.B);
}

}  // namespace

std::string CheckNormSupported(const NormLaunch& n) {
  if (n.T < 0 || n.R < 0 || n.D < 0 || n.B < 0) return "sizes must be >= 0, got " + Sizes(n);
  if (n.dtype != DType::kFloat16 && n.dtype != DType::kBFloat16) {
    return std::string("element type ") + DTypeName(n.dtype) + " has no CUDA kernel (float16 and bfloat16 do)";
  }
  if (n.D % 16 != 0) {
    return "D = " + std::to_string(n.D) + " must be a multiple of 16 on the CUDA EP (the AOT cubins assume it)";
  }
  const int widest = MaxBlockD(n.dtype);
  if (n.D > widest) {
    return "D = " + std::to_string(n.D) + " exceeds the widest compiled row of this library (" +
           std::to_string(widest) + " columns)";
  }
  if (n.T > kMaxRows || n.R > kMaxRows || n.B >= kInt32Limit) {
    return Sizes(n) + " exceed the int32 sizes of the kernel";
  }
  int64_t elements = 0;
  if (__builtin_mul_overflow(n.T, n.D, &elements) || __builtin_mul_overflow(n.R, n.D, &elements)) {
    return Sizes(n) + ": the element count overflows int64";
  }
  const void* ptrs[] = {n.x, n.skip, n.bias, n.index, n.gamma, n.beta, n.cu, n.normed, n.sum};
  const char* names[] = {"X", "Skip", "Bias", "Index", "Gamma", "Beta", "CuSeqlens", "Normed", "Sum"};
  for (int i = 0; i < 9; ++i) {
    if (reinterpret_cast<uintptr_t>(ptrs[i]) % 16 != 0) {
      return std::string("device buffer '") + names[i] + "' is not 16-byte aligned";
    }
  }
  return "";
}

std::string LaunchGatherLayerNorm(const NormLaunch& n) {
  std::string err = CheckNormSupported(n);
  if (!err.empty()) return err;
  if (n.R == 0 || n.D == 0) return "";  // empty outputs: nothing to launch
  err = DriverError();
  if (!err.empty()) return err;
  CUfunction fn = nullptr;
  long index = -1;
  LaunchScope scope;
  err = EnterContext(n.stream, n.device_ordinal, scope, [&](int arch, const LoadFn& load) -> std::string {
    index = PickNormImage(n, arch);
    if (index < 0) {
      return std::string("no GatherLayerNorm cubin for sm_") + std::to_string(arch) + " " + DTypeName(n.dtype) +
             (n.index_type == IndexType::kInt32 ? "/int32" : "/int64") + " and D = " + std::to_string(n.D) +
             " in this library (rebuild with build.py --archs)";
    }
    const NormImage& im = kNormImages[index];
    return load(CubinRef{im.cubin, im.function_name, im.shared_bytes}, &fn);
  });
  if (!err.empty()) return err;

  const NormImage& im = kNormImages[index];
  const int64_t programs = (n.R + im.block_r - 1) / im.block_r;  // R <= kMaxRows: int32
  // absent skip / bias / cu: X's pointer stands in (never read: has_skip / has_bias / has_live = 0)
  CUdeviceptr x = reinterpret_cast<CUdeviceptr>(n.x);
  CUdeviceptr skip = reinterpret_cast<CUdeviceptr>(n.skip != nullptr ? n.skip : n.x);
  CUdeviceptr bias = reinterpret_cast<CUdeviceptr>(n.bias != nullptr ? n.bias : n.x);
  CUdeviceptr idx = reinterpret_cast<CUdeviceptr>(n.index), gamma = reinterpret_cast<CUdeviceptr>(n.gamma);
  CUdeviceptr beta = reinterpret_cast<CUdeviceptr>(n.beta), normed = reinterpret_cast<CUdeviceptr>(n.normed);
  CUdeviceptr cu = reinterpret_cast<CUdeviceptr>(n.cu != nullptr ? n.cu : n.x);
  CUdeviceptr sum = reinterpret_cast<CUdeviceptr>(n.sum), scratch = 0, profile_scratch = 0;
  int32_t T = static_cast<int32_t>(n.T), R = static_cast<int32_t>(n.R), D = static_cast<int32_t>(n.D);
  int32_t B = static_cast<int32_t>(n.B);
  int32_t has_skip = n.skip != nullptr, has_bias = n.bias != nullptr, has_live = n.cu != nullptr;
  float eps = n.epsilon;
  // X, Skip, Bias, Index, Gamma, Beta, CU, N, Sum, T, R, D, B, eps, has_skip, has_bias, has_live, global / profile
  // scratch
  void* args[] = {&x,  &skip, &bias, &idx, &gamma,    &beta,     &cu,       &normed,  &sum,           &T,
                  &R,  &D,    &B,    &eps, &has_skip, &has_bias, &has_live, &scratch, &profile_scratch};
  constexpr int kParams = static_cast<int>(sizeof(args) / sizeof(void*));
  if (im.num_params != kParams) {
    return std::string(im.function_name) + ": cubin expects " + std::to_string(im.num_params) +
           " parameters, launcher passes " + std::to_string(kParams);
  }
  return Launch(fn, static_cast<unsigned>(programs), 1, im.num_warps, im.shared_bytes, n.stream, args,
                "_gather_layer_norm");
}

}  // namespace raggedvit::cuda

// Launcher of the AOT-compiled bias + GELU kernel (raggedvit/kernels/_linear_kernel.py:_bias_gelu): the image of
// the device's arch (same major, highest minor <= the device's) for gelu_config(M), then the context / module
// cache / cuLaunchKernel path shared with the other launchers (launch_context.h). One launch.
#include <cstdint>
#include <string>

#include "launch_context.h"
#include "launcher.h"

namespace raggedvit::cuda {

namespace {

constexpr int64_t kInt32Limit = int64_t{1} << 31;  // the kernel takes M, N and its program id as int32
// rows / columns of the last tile (pid * BLOCK + arange, BLOCK <= 1024) are int32 in the kernel too
constexpr int64_t kMaxRowsCols = kInt32Limit - 2048;

long PickGeluImage(const GeluLaunch& g, GeluConfig want, int arch) {
  long best = -1;
  for (size_t i = 0; i < kNumGeluImages; ++i) {
    const GeluImage& im = kGeluImages[i];
    if (im.dtype != g.dtype || im.config != want || im.arch / 10 != arch / 10 || im.arch > arch) continue;
    if (best < 0 || im.arch > kGeluImages[best].arch) best = static_cast<long>(i);
  }
  return best;
}

std::string Sizes(const GeluLaunch& g) { return "M = " + std::to_string(g.M) + ", N = " + std::to_string(g.N); }

}  // namespace

GeluConfig PreferredGeluConfig(int64_t M) { return M >= kGeluLargeM ? GeluConfig::kLarge : GeluConfig::kSmall; }

std::string CheckGeluSupported(const GeluLaunch& g) {
  if (g.M < 0 || g.N < 0) return "sizes must be >= 0, got " + Sizes(g);
  if (g.dtype != DType::kFloat16 && g.dtype != DType::kBFloat16) {
    return std::string("element type ") + DTypeName(g.dtype) + " has no CUDA kernel (float16 and bfloat16 do)";
  }
  if (g.N % 16 != 0) {
    return "N = " + std::to_string(g.N) + " must be a multiple of 16 on the CUDA EP (the AOT cubins assume it)";
  }
  if (g.M > kMaxRowsCols || g.N > kMaxRowsCols) return Sizes(g) + " exceed the int32 sizes of the kernel";
  const void* ptrs[] = {g.x, g.bias, g.y};
  const char* names[] = {"X", "Bias", "Y"};
  for (int i = 0; i < 3; ++i) {
    if (reinterpret_cast<uintptr_t>(ptrs[i]) % 16 != 0) {
      return std::string("device buffer '") + names[i] + "' is not 16-byte aligned";
    }
  }
  return "";
}

std::string LaunchBiasGelu(const GeluLaunch& g) {
  std::string err = CheckGeluSupported(g);
  if (!err.empty()) return err;
  if (g.M == 0 || g.N == 0) return "";  // empty Y: nothing to launch
  err = DriverError();
  if (!err.empty()) return err;
  const GeluConfig want = PreferredGeluConfig(g.M);
  CUfunction fn = nullptr;
  long index = -1;
  LaunchScope scope;
  err = EnterContext(g.stream, g.device_ordinal, scope, [&](int arch, const LoadFn& load) -> std::string {
    index = PickGeluImage(g, want, arch);
    if (index < 0) {
      return std::string("no BiasGelu cubin for sm_") + std::to_string(arch) + " " + DTypeName(g.dtype) + " config " +
             (want == GeluConfig::kLarge ? "large" : "small") + " in this library (rebuild with build.py --archs)";
    }
    const GeluImage& im = kGeluImages[index];
    return load(CubinRef{im.cubin, im.function_name, im.shared_bytes}, &fn);
  });
  if (!err.empty()) return err;

  const GeluImage& im = kGeluImages[index];
  const int64_t grid_m = (g.M + im.block_m - 1) / im.block_m, grid_n = (g.N + im.block_n - 1) / im.block_n;
  int64_t programs = 0;
  if (__builtin_mul_overflow(grid_m, grid_n, &programs) || programs >= kInt32Limit) {
    return Sizes(g) + ": cdiv(M, " + std::to_string(im.block_m) + ") * cdiv(N, " + std::to_string(im.block_n) +
           ") programs exceed the int32 grid of the kernel";
  }
  // absent bias: X's pointer stands in (never read: has_bias = 0)
  CUdeviceptr x = reinterpret_cast<CUdeviceptr>(g.x);
  CUdeviceptr bias = reinterpret_cast<CUdeviceptr>(g.bias != nullptr ? g.bias : g.x);
  CUdeviceptr y = reinterpret_cast<CUdeviceptr>(g.y), scratch = 0, profile_scratch = 0;
  int32_t M = static_cast<int32_t>(g.M), N = static_cast<int32_t>(g.N), has_bias = g.bias != nullptr;
  void* args[] = {&x, &bias, &y, &M, &N, &has_bias, &scratch, &profile_scratch};
  constexpr int kParams = static_cast<int>(sizeof(args) / sizeof(void*));
  if (im.num_params != kParams) {
    return std::string(im.function_name) + ": cubin expects " + std::to_string(im.num_params) +
           " parameters, launcher passes " + std::to_string(kParams);
  }
  return Launch(fn, static_cast<unsigned>(programs), 1, im.num_warps, im.shared_bytes, g.stream, args,
                "_bias_gelu");
}

}  // namespace raggedvit::cuda

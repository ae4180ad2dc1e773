// Launcher of the AOT-compiled patch embedding kernel (raggedvit/kernels/_embed_kernel.py:_patch_embed): the image
// of the device's arch (same major, highest minor <= the device's) for embed_config(B * L), else the next smaller
// config of that arch, aligned or not as the sizes allow (Aligned), then the context / module cache /
// cuLaunchKernel path shared with the other launchers (launch_context.h). One launch.
#include <cstdint>
#include <string>

#include "launch_context.h"
#include "launcher.h"

namespace raggedvit::cuda {

namespace {

constexpr int64_t kInt32Limit = int64_t{1} << 31;  // the kernel takes its sizes and program id as int32
// rows of the last tile (pid * BLOCK_M + arange, BLOCK_M <= 128) are int32 in the kernel too
constexpr int64_t kMaxRows = kInt32Limit - 256;

const char* ConfigName(EmbedConfig c) {
  return c == EmbedConfig::kLarge ? "large" : c == EmbedConfig::kMid ? "mid" : "small";
}

// The aligned cubins assume W, patch and K = C * patch^2 are multiples of 16 (their compile-time hints).
bool Aligned(const EmbedLaunch& e) { return e.patch % 16 == 0 && e.W % 16 == 0; }

// The arch first (same major, the highest minor <= the device's with an image of this dtype and alignment), then
// the wanted config of that arch, else its next smaller one (as PickLinearImage).
long PickEmbedImage(const EmbedLaunch& e, EmbedConfig want, int arch) {
  const bool aligned = Aligned(e);
  auto usable = [&](const EmbedImage& im) {
    return im.dtype == e.dtype && im.aligned == aligned && im.arch / 10 == arch / 10 && im.arch <= arch;
  };
  int best_arch = -1;
  for (size_t i = 0; i < kNumEmbedImages; ++i) {
    if (usable(kEmbedImages[i]) && kEmbedImages[i].arch > best_arch) best_arch = kEmbedImages[i].arch;
  }
  for (int c = static_cast<int>(want); c >= 0 && best_arch >= 0; --c) {
    for (size_t i = 0; i < kNumEmbedImages; ++i) {
      const EmbedImage& im = kEmbedImages[i];
      if (usable(im) && im.arch == best_arch && static_cast<int>(im.config) == c) return static_cast<long>(i);
    }
  }
  return -1;
}

std::string Sizes(const EmbedLaunch& e) {
  return "B = " + std::to_string(e.B) + ", C = " + std::to_string(e.C) + ", H = " + std::to_string(e.H) +
         ", W = " + std::to_string(e.W) + ", patch = " + std::to_string(e.patch) + ", P = " + std::to_string(e.P) +
         ", N = " + std::to_string(e.N);
}

}  // namespace

EmbedConfig PreferredEmbedConfig(int64_t M) {
  return M >= kEmbedLargeM ? EmbedConfig::kLarge : M >= kEmbedMidM ? EmbedConfig::kMid : EmbedConfig::kSmall;
}

std::string CheckEmbedSupported(const EmbedLaunch& e) {
  if (e.B < 0 || e.C < 0 || e.H < 0 || e.W < 0 || e.P < 0 || e.N < 0 || e.patch < 1) {
    return "sizes must be >= 0 and patch >= 1, got " + Sizes(e);
  }
  if (e.dtype != DType::kFloat32 && e.dtype != DType::kFloat16) {
    return std::string("image element type ") + DTypeName(e.dtype) + " has no CUDA kernel (float and float16 do)";
  }
  if (e.N % 16 != 0) {
    return "N = " + std::to_string(e.N) + " must be a multiple of 16 on the CUDA EP (the AOT cubins assume it)";
  }
  const int64_t gh = e.H / e.patch, gw = e.W / e.patch;
  int64_t pixels = 0, K = 0, M = 0, prefix_rows = 0, programs = 0;
  if (__builtin_mul_overflow(e.C, e.H, &pixels) || __builtin_mul_overflow(pixels, e.W, &pixels) ||
      pixels >= kInt32Limit || __builtin_mul_overflow(e.C, e.patch * e.patch, &K) || K >= kInt32Limit ||
      e.N >= kInt32Limit || __builtin_mul_overflow(e.B, gh * gw, &M) || M > kMaxRows ||
      __builtin_mul_overflow(e.B, e.P, &prefix_rows) || prefix_rows > kMaxRows || e.P + gh * gw >= kInt32Limit) {
    return Sizes(e) + " exceed the int32 sizes of the kernel (pixels per image, K, rows)";
  }
  // the largest grid: 32-row tiles (the small config) over both row ranges, 64-column tiles
  const int64_t tiles_m = (M + 31) / 32 + (prefix_rows + 31) / 32;
  if (__builtin_mul_overflow(tiles_m, (e.N + 63) / 64, &programs) || programs >= kInt32Limit) {
    return Sizes(e) + ": the tiles exceed the int32 grid of the kernel";
  }
  const void* ptrs[] = {e.images, e.weight, e.prefix, e.pos, e.out};
  const char* names[] = {"Images", "Weight", "Prefix", "Pos", "Out"};
  for (int i = 0; i < 5; ++i) {
    if (reinterpret_cast<uintptr_t>(ptrs[i]) % 16 != 0) {
      return std::string("device buffer '") + names[i] + "' is not 16-byte aligned";
    }
  }
  return "";
}

std::string LaunchPatchEmbed(const EmbedLaunch& e) {
  std::string err = CheckEmbedSupported(e);
  if (!err.empty()) return err;
  const int64_t gh = e.H / e.patch, gw = e.W / e.patch, L = gh * gw;
  if (e.B == 0 || e.N == 0 || e.P + L == 0) return "";  // empty Out: nothing to launch
  err = DriverError();
  if (!err.empty()) return err;
  const EmbedConfig want = PreferredEmbedConfig(e.B * L);
  CUfunction fn = nullptr;
  long index = -1;
  LaunchScope scope;
  err = EnterContext(e.stream, e.device_ordinal, scope, [&](int arch, const LoadFn& load) -> std::string {
    index = PickEmbedImage(e, want, arch);
    if (index < 0) {
      return std::string("no PatchEmbed cubin for sm_") + std::to_string(arch) + " " + DTypeName(e.dtype) +
             " images, config " + ConfigName(want) + " or smaller" + (Aligned(e) ? " (aligned)" : "") +
             ", in this library (rebuild with build.py --archs)";
    }
    const EmbedImage& im = kEmbedImages[index];
    return load(CubinRef{im.cubin, im.function_name, im.shared_bytes}, &fn);
  });
  if (!err.empty()) return err;

  const EmbedImage& im = kEmbedImages[index];
  // sizes checked by CheckEmbedSupported: the grid fits int32 for every config (block_m >= 32, block_n >= 64)
  const int64_t tiles_m = (e.B * L + im.block_m - 1) / im.block_m + (e.B * e.P + im.block_m - 1) / im.block_m;
  const int64_t programs = tiles_m * ((e.N + im.block_n - 1) / im.block_n);
  CUdeviceptr images = reinterpret_cast<CUdeviceptr>(e.images), weight = reinterpret_cast<CUdeviceptr>(e.weight);
  CUdeviceptr prefix = reinterpret_cast<CUdeviceptr>(e.prefix), pos = reinterpret_cast<CUdeviceptr>(e.pos);
  CUdeviceptr out = reinterpret_cast<CUdeviceptr>(e.out), scratch = 0, profile_scratch = 0;
  int32_t B = static_cast<int32_t>(e.B), C = static_cast<int32_t>(e.C), H = static_cast<int32_t>(e.H);
  int32_t W = static_cast<int32_t>(e.W), GW = static_cast<int32_t>(gw), LL = static_cast<int32_t>(L);
  int32_t P = static_cast<int32_t>(e.P), N = static_cast<int32_t>(e.N);
  int32_t K = static_cast<int32_t>(e.C * e.patch * e.patch), patch = static_cast<int32_t>(e.patch);
  // Img, W, Prefix, Pos, Out, B, C, H, Wd, gw, L, P, N, K, patch, global / profile scratch
  void* args[] = {&images, &weight, &prefix, &pos, &out, &B, &C, &H, &W, &GW, &LL, &P, &N, &K, &patch,
                  &scratch, &profile_scratch};
  constexpr int kParams = static_cast<int>(sizeof(args) / sizeof(void*));
  if (im.num_params != kParams) {
    return std::string(im.function_name) + ": cubin expects " + std::to_string(im.num_params) +
           " parameters, launcher passes " + std::to_string(kParams);
  }
  return Launch(fn, static_cast<unsigned>(programs), 1, im.num_warps, im.shared_bytes, e.stream, args,
                "_patch_embed");
}

}  // namespace raggedvit::cuda

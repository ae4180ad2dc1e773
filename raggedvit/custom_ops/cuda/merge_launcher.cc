// Launcher of the AOT-compiled token merging kernel (raggedvit/kernels/_merge_kernel.py: _ragged_merge): for the
// device's arch the image of the launch's dtype (same major, highest minor <= the device's; of those, the smallest
// width >= n_A, then the smallest block_d >= Dh: merge_launch_config / merge_head_block), then the context / module
// cache / cuLaunchKernel path shared with the other launchers (launch_context.h). One launch of grid (B,); the
// kernel reads no cu (n = T / B) and writes every output, cu_out included.
#include <cstdint>
#include <string>

#include "launch_context.h"
#include "launcher.h"

namespace raggedvit::cuda {

namespace {

// the kernel takes n, C, H, Dh, num_prefix, r as int32 and indexes rows (b*n, b*m) and 3*H*Dh in int32; row offsets
// (row * C, row * 3*H*Dh) are int64
constexpr int64_t kMaxSize = (int64_t{1} << 31) - 1;

std::string Sizes(const MergeLaunch& m) {
  return "T = " + std::to_string(m.T) + ", B = " + std::to_string(m.B) + ", C = " + std::to_string(m.C) +
         ", H = " + std::to_string(m.H) + ", Dh = " + std::to_string(m.Dh) + ", num_prefix = " +
         std::to_string(m.num_prefix);
}

// rows of set A per image (merge_widths): positions a0, a0 + 2, ... < n, a0 = p + p % 2
int64_t RowsOfA(int64_t n, int64_t p) {
  const int64_t a0 = p + p % 2;
  return a0 > n ? 0 : (n - a0 + 1) / 2;
}

// The widest width and block_d of the dtype's images (0 when the library has none).
void Widest(DType dtype, int* width, int* block_d) {
  *width = *block_d = 0;
  for (size_t i = 0; i < kNumMergeImages; ++i) {
    const MergeImage& im = kMergeImages[i];
    if (im.dtype != dtype || im.arch == 0) continue;
    if (im.width > *width) *width = im.width;
    if (im.block_d > *block_d) *block_d = im.block_d;
  }
}

long PickMergeImage(DType dtype, int arch, int64_t n_a, int64_t dh) {
  long best = -1;
  for (size_t i = 0; i < kNumMergeImages; ++i) {
    const MergeImage& im = kMergeImages[i];
    if (im.dtype != dtype || im.arch / 10 != arch / 10 || im.arch > arch) continue;
    if (im.width < n_a || im.block_d < dh) continue;
    if (best < 0) {
      best = static_cast<long>(i);
      continue;
    }
    const MergeImage& cur = kMergeImages[best];
    const bool narrower = im.width < cur.width || (im.width == cur.width && im.block_d < cur.block_d);
    if (im.arch > cur.arch || (im.arch == cur.arch && narrower)) best = static_cast<long>(i);
  }
  return best;
}

}  // namespace

std::string CheckMergeSupported(const MergeLaunch& m) {
  if (m.T < 0 || m.B < 1 || m.C < 0 || m.H < 1 || m.Dh < 1 || m.num_prefix < 0 || m.r < 0) {
    return "sizes must be T >= 0, B >= 1, C >= 0, H >= 1, Dh >= 1, num_prefix >= 0, r >= 0, got " + Sizes(m) +
           ", r = " + std::to_string(m.r);
  }
  if (m.T % m.B != 0) return Sizes(m) + ": T is not a multiple of B";
  const int64_t n = m.T / m.B;
  if (m.num_prefix > n) return Sizes(m) + ": num_prefix exceeds the n = " + std::to_string(n) + " rows per image";
  if (m.dtype != DType::kFloat16 && m.dtype != DType::kFloat32) {
    return std::string("element type ") + DTypeName(m.dtype) + " has no CUDA merge kernel (float16 and float do)";
  }
  if (m.C % 16 != 0 || m.Dh % 16 != 0) {
    return Sizes(m) + ": C and Dh must be multiples of 16 on the CUDA EP (the AOT cubins assume it)";
  }
  int64_t width3 = 0;  // 3*H*Dh, the qkv row
  if (__builtin_mul_overflow(m.H, m.Dh, &width3) || __builtin_mul_overflow(width3, int64_t{3}, &width3) ||
      width3 > kMaxSize || m.T > kMaxSize || m.C > kMaxSize || m.B > kMaxSize) {
    return Sizes(m) + " exceed the int32 sizes of the kernel";
  }
  int widest = 0, widest_d = 0;
  Widest(m.dtype, &widest, &widest_d);
  const int64_t n_a = RowsOfA(n, m.num_prefix);
  if (m.Dh > widest_d) {
    return "head dim Dh = " + std::to_string(m.Dh) + " exceeds the widest compiled head-dim block of this library (" +
           std::to_string(widest_d) + ")";
  }
  if (n_a > widest) {
    return "n_A = " + std::to_string(n_a) + " rows of set A per image (n = " + std::to_string(n) +
           ", num_prefix = " + std::to_string(m.num_prefix) + ") exceed the widest compiled width of this library (" +
           std::to_string(widest) + ")";
  }
  if (m.skip_bias != nullptr && m.skip == nullptr) return "skip_bias is given without skip";
  const void* ptrs[] = {m.x,      m.qkv,    m.qkv_bias, m.size,     m.skip, m.skip_bias,
                        m.x_out,  m.size_out, m.cu_out, m.src,      m.key_bias, m.score};
  const char* names[] = {"x",     "qkv",      "qkv_bias", "size", "skip",     "skip_bias",
                         "x_out", "size_out", "cu_out",   "src",  "key_bias", "score"};
  static_assert(sizeof(ptrs) / sizeof(ptrs[0]) == sizeof(names) / sizeof(names[0]), "one name per buffer");
  for (size_t i = 0; i < sizeof(ptrs) / sizeof(ptrs[0]); ++i) {
    if (reinterpret_cast<uintptr_t>(ptrs[i]) % 16 != 0) {
      return std::string("device buffer '") + names[i] + "' is not 16-byte aligned";
    }
  }
  return "";
}

std::string LaunchRaggedMerge(const MergeLaunch& m) {
  std::string err = CheckMergeSupported(m);
  if (!err.empty()) return err;
  err = DriverError();
  if (!err.empty()) return err;
  const int64_t n = m.T / m.B;
  const int64_t n_a = RowsOfA(n, m.num_prefix);
  CUfunction fn = nullptr;
  long index = -1;
  LaunchScope scope;
  err = EnterContext(m.stream, m.device_ordinal, scope, [&](int arch, const LoadFn& load) -> std::string {
    index = PickMergeImage(m.dtype, arch, n_a, m.Dh);
    if (index < 0) {
      return std::string("no RaggedMerge cubin for sm_") + std::to_string(arch) + " " + DTypeName(m.dtype) +
             " (n_A = " + std::to_string(n_a) + ", Dh = " + std::to_string(m.Dh) +
             ") in this library (rebuild with build.py --archs)";
    }
    const MergeImage& im = kMergeImages[index];
    return load(CubinRef{im.cubin, im.function_name, im.shared_bytes}, &fn);
  });
  if (!err.empty()) return err;

  const MergeImage& im = kMergeImages[index];
  // absent inputs: a pointer of the same type that the kernel never reads (its flag is 0)
  CUdeviceptr x = reinterpret_cast<CUdeviceptr>(m.x), qkv = reinterpret_cast<CUdeviceptr>(m.qkv);
  CUdeviceptr bias = reinterpret_cast<CUdeviceptr>(m.qkv_bias != nullptr ? m.qkv_bias : m.qkv);
  CUdeviceptr size = reinterpret_cast<CUdeviceptr>(m.size != nullptr ? m.size : m.size_out);
  CUdeviceptr skip = reinterpret_cast<CUdeviceptr>(m.skip != nullptr ? m.skip : m.x);
  CUdeviceptr skip_bias = reinterpret_cast<CUdeviceptr>(m.skip_bias != nullptr ? m.skip_bias : m.x);
  CUdeviceptr x_out = reinterpret_cast<CUdeviceptr>(m.x_out), size_out = reinterpret_cast<CUdeviceptr>(m.size_out);
  CUdeviceptr cu_out = reinterpret_cast<CUdeviceptr>(m.cu_out), src = reinterpret_cast<CUdeviceptr>(m.src);
  CUdeviceptr key_bias = reinterpret_cast<CUdeviceptr>(m.key_bias), score = reinterpret_cast<CUdeviceptr>(m.score);
  CUdeviceptr scratch = 0, profile_scratch = 0;
  const int64_t r = m.r < n ? m.r : n;  // the kernel clamps r to (n - p) / 2 itself; this keeps it in int32
  int32_t n32 = static_cast<int32_t>(n), C = static_cast<int32_t>(m.C), H = static_cast<int32_t>(m.H);
  int32_t Dh = static_cast<int32_t>(m.Dh), p = static_cast<int32_t>(m.num_prefix), r32 = static_cast<int32_t>(r);
  int32_t has_bias = m.qkv_bias != nullptr, has_size = m.size != nullptr, class_token = m.class_token ? 1 : 0;
  int32_t has_skip = m.skip != nullptr, has_skip_bias = m.skip_bias != nullptr;
  void* args[] = {&x,         &qkv,      &bias,        &size,    &skip,     &skip_bias,     &x_out, &size_out,
                  &cu_out,    &src,      &key_bias,    &score,   &n32,      &C,             &H,     &Dh,
                  &p,         &r32,      &has_bias,    &has_size, &has_skip, &has_skip_bias, &class_token,
                  &scratch,   &profile_scratch};
  const int count = static_cast<int>(sizeof(args) / sizeof(void*));
  if (im.num_params != count) {
    return std::string(im.function_name) + ": cubin expects " + std::to_string(im.num_params) +
           " parameters, launcher passes " + std::to_string(count);
  }
  return Launch(fn, static_cast<unsigned>(m.B), 1, im.num_warps, im.shared_bytes, m.stream, args, "_ragged_merge");
}

}  // namespace raggedvit::cuda

// Launcher of the AOT-compiled selection kernels (raggedvit/kernels/_select_kernel.py): for the device's arch the
// image of each kernel (same major, highest minor <= the device's; of those, the smallest sort width >= the image
// width, else the largest: the rule of _select_kernel.select_launch_config), then the context / module cache /
// cuLaunchKernel path shared with the other launchers (launch_context.h). Two launches of grid (B,).
#include <cstdint>
#include <cstring>
#include <string>

#include "launch_context.h"
#include "launcher.h"

namespace raggedvit::cuda {

namespace {

// the kernels take T, B, W, bound, num_prefix as int32; slot indices j < W + BLOCK and the chunk loops stay int32
constexpr int64_t kMaxSize = (int64_t{1} << 31) - 1024;

// true when image a fits width better than image b (both of one arch): a covers width and b does not, or both
// cover it and a is narrower, or neither does and a is wider
bool FitsBetter(const SelectImage& a, const SelectImage& b, int64_t width) {
  const bool ca = a.sort_width >= width, cb = b.sort_width >= width;
  if (ca != cb) return ca;
  return ca ? a.sort_width < b.sort_width : a.sort_width > b.sort_width;
}

long PickSelectImage(SelectKernel kernel, int arch, int64_t width) {
  long best = -1;
  for (size_t i = 0; i < kNumSelectImages; ++i) {
    const SelectImage& im = kSelectImages[i];
    if (im.kernel != kernel || im.arch / 10 != arch / 10 || im.arch > arch) continue;
    if (best < 0) {
      best = static_cast<long>(i);
      continue;
    }
    const SelectImage& cur = kSelectImages[best];
    if (im.arch > cur.arch || (im.arch == cur.arch && FitsBetter(im, cur, width))) best = static_cast<long>(i);
  }
  return best;
}

std::string Sizes(const SelectLaunch& s) {
  return "T = " + std::to_string(s.T) + ", B = " + std::to_string(s.B) + ", width = " + std::to_string(s.width) +
         ", bound = " + std::to_string(s.bound) + ", num_prefix = " + std::to_string(s.num_prefix);
}

int32_t Bits(float v) {
  int32_t b = 0;
  std::memcpy(&b, &v, sizeof(b));
  return b;
}

}  // namespace

std::string CheckSelectSupported(const SelectLaunch& s) {
  if (s.T < 0 || s.B < 1 || s.width < 1 || s.bound < 0 || s.bound > s.width || s.num_prefix < 0) {
    return "sizes must be T >= 0, B >= 1, 0 <= bound <= width, width >= 1, num_prefix >= 0, got " + Sizes(s);
  }
  if (s.T > kMaxSize || s.B > kMaxSize || s.width > kMaxSize || s.num_prefix > kMaxSize) {
    return Sizes(s) + " exceed the int32 sizes of the kernels";
  }
  if (s.policy != 0 && s.policy != 1) return "policy must be 0 or 1, got " + std::to_string(s.policy);
  const void* ptrs[] = {s.scores, s.cu, s.k, s.src, s.cu_new, s.seq_id, s.pos};
  const char* names[] = {"scores", "cu", "k", "src", "cu_new", "seq_id", "pos"};
  for (int i = 0; i < 7; ++i) {
    if (reinterpret_cast<uintptr_t>(ptrs[i]) % 16 != 0) {
      return std::string("device buffer '") + names[i] + "' is not 16-byte aligned";
    }
  }
  return "";
}

std::string LaunchRaggedSelect(const SelectLaunch& s) {
  std::string err = CheckSelectSupported(s);
  if (!err.empty()) return err;
  err = DriverError();
  if (!err.empty()) return err;
  CUfunction fns[2] = {nullptr, nullptr};
  long index[2] = {-1, -1};
  LaunchScope scope;
  err = EnterContext(s.stream, s.device_ordinal, scope, [&](int arch, const LoadFn& load) -> std::string {
    for (int i = 0; i < 2; ++i) {
      index[i] = PickSelectImage(static_cast<SelectKernel>(i), arch, s.width);
      if (index[i] < 0) {
        return std::string("no RaggedSelect cubin for sm_") + std::to_string(arch) +
               " in this library (rebuild with build.py --archs)";
      }
      const SelectImage& im = kSelectImages[index[i]];
      std::string e = load(CubinRef{im.cubin, im.function_name, im.shared_bytes}, &fns[i]);
      if (!e.empty()) return e;
    }
    return "";
  });
  if (!err.empty()) return err;

  CUdeviceptr scores = reinterpret_cast<CUdeviceptr>(s.scores), cu = reinterpret_cast<CUdeviceptr>(s.cu);
  CUdeviceptr k = reinterpret_cast<CUdeviceptr>(s.k), src = reinterpret_cast<CUdeviceptr>(s.src);
  CUdeviceptr cu_new = reinterpret_cast<CUdeviceptr>(s.cu_new), seq_id = reinterpret_cast<CUdeviceptr>(s.seq_id);
  CUdeviceptr pos = reinterpret_cast<CUdeviceptr>(s.pos), scratch = 0, profile_scratch = 0;
  int32_t T = static_cast<int32_t>(s.T), B = static_cast<int32_t>(s.B), W = static_cast<int32_t>(s.width);
  int32_t bound = static_cast<int32_t>(s.bound), p = static_cast<int32_t>(s.num_prefix);
  int32_t policy = static_cast<int32_t>(s.policy), keep_bits = Bits(s.keep), mass_bits = Bits(s.mass);
  void* count_args[] = {&scores, &cu, &k, &T, &B, &W, &p, &policy, &keep_bits, &mass_bits, &scratch, &profile_scratch};
  void* scatter_args[] = {&scores, &cu, &k,     &src, &cu_new, &seq_id,  &pos,
                          &T,      &B,  &W,     &bound, &p,    &scratch, &profile_scratch};
  void** args[2] = {count_args, scatter_args};
  const int counts[2] = {static_cast<int>(sizeof(count_args) / sizeof(void*)),
                         static_cast<int>(sizeof(scatter_args) / sizeof(void*))};
  const char* what[2] = {"_select_count", "_select_scatter"};
  for (int i = 0; i < 2; ++i) {  // both kernels checked before the first launch: a refusal launches nothing
    const SelectImage& im = kSelectImages[index[i]];
    if (im.num_params != counts[i]) {
      return std::string(im.function_name) + ": cubin expects " + std::to_string(im.num_params) +
             " parameters, launcher passes " + std::to_string(counts[i]);
    }
  }
  for (int i = 0; i < 2; ++i) {
    const SelectImage& im = kSelectImages[index[i]];
    err = Launch(fns[i], static_cast<unsigned>(s.B), 1, im.num_warps, im.shared_bytes, s.stream, args[i], what[i]);
    if (!err.empty()) return err;
  }
  return "";
}

}  // namespace raggedvit::cuda

// Launcher of the AOT-compiled ragged linear kernel (raggedvit/kernels/_linear_kernel.py:_ragged_linear): the
// config of linear_config(T, N, has_live), falling back per arch to the next smaller config the build kept, then the
// context / module cache / cuLaunchKernel path shared with the attention launcher (launch_context.h).
#include <cstdint>
#include <string>

#include "launch_context.h"
#include "launcher.h"

namespace raggedvit::cuda {

namespace {

constexpr int64_t kInt32Limit = int64_t{1} << 31;  // the kernel takes T, N, K, B and its program ids as int32
// rows / columns of the last tile (pid * BLOCK + arange, BLOCK <= 128) are int32 in the kernel too
constexpr int64_t kMaxRowsCols = kInt32Limit - 256;

const char* ConfigName(LinearConfig c) {
  switch (c) {
    case LinearConfig::kTma:
      return "tma";
    case LinearConfig::kXLarge:
      return "xlarge";
    case LinearConfig::kLarge:
      return "large";
    case LinearConfig::kSmallWide:
      return "small_wide";
    default:
      return "small_narrow";
  }
}

// Image for the launch: same major and highest minor <= the device's (SASS is not forward compatible across
// majors), then the largest config of that arch not above `want`. -1 when none fits.
long PickLinearImage(const LinearLaunch& l, LinearConfig want, int arch) {
  long best = -1;
  for (size_t i = 0; i < kNumLinearImages; ++i) {
    const LinearImage& im = kLinearImages[i];
    if (im.dtype != l.dtype || im.index_type != l.index_type) continue;
    if (im.arch / 10 != arch / 10 || im.arch > arch || im.config > want) continue;
    if (best < 0) {
      best = static_cast<long>(i);
      continue;
    }
    const LinearImage& b = kLinearImages[best];
    if (im.arch > b.arch || (im.arch == b.arch && im.config > b.config)) best = static_cast<long>(i);
  }
  return best;
}

std::string Sizes(const LinearLaunch& l);

// The kernels' int32 arguments after the data (both kernels take them in this order; CheckLinearSupported bounds
// the sizes to int32).
struct LinearScalars {
  explicit LinearScalars(const LinearLaunch& l)
      : T(static_cast<int32_t>(l.T)),
        N(static_cast<int32_t>(l.N)),
        K(static_cast<int32_t>(l.K)),
        B(static_cast<int32_t>(l.B)),
        has_bias(l.bias != nullptr),
        has_res(l.residual != nullptr),
        has_live(l.cu != nullptr),
        activation(l.activation) {}
  int32_t T, N, K, B, has_bias, has_res, has_live, activation;
};

// Launches im's function over a (programs, 1) grid once the cubin's parameter count matches the launcher's.
std::string LaunchChecked(const LinearLaunch& l, const LinearImage& im, CUfunction fn, int64_t programs, void** args,
                          int num_args) {
  if (im.num_params != num_args) {
    return std::string(im.function_name) + ": cubin expects " + std::to_string(im.num_params) +
           " parameters, launcher passes " + std::to_string(num_args);
  }
  return Launch(fn, static_cast<unsigned>(programs), 1, im.num_warps, im.shared_bytes, l.stream, args,
                im.function_name);
}

// _ragged_linear_tma: X [T, K], W [N, K], Residual [T, N] (Y's map when absent: never read) and Y [T, N] as 2-D
// TMA descriptors in boxes of 64 columns (128 bytes, 128-byte swizzle) by BLOCK_M / BLOCK_N rows: the AOT build
// checks the cubin was compiled for these. Each map is followed by its int32 sizes and int64 strides (Triton's
// expansion of a descriptor argument); then Bias, CuSeqlens, the sizes and flags, and the persistent grid's size:
// min(programs_per_sm x SMs, tiles) programs walk the live tiles.
std::string LaunchTma(const LinearLaunch& l, const LinearImage& im, CUfunction fn, int64_t tiles, int sm_count,
                      CUdeviceptr bias, CUdeviceptr cu) {
  if (sm_count <= 0) return "the device reports " + std::to_string(sm_count) + " multiprocessors";
  const CUtensorMapDataType type =
      l.dtype == DType::kBFloat16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  constexpr uint32_t kBoxCols = 64;  // 128 bytes of 2-byte elements
  struct Map {
    alignas(64) CUtensorMap map;  // by value in the kernel's params (__grid_constant__)
    int32_t rows, cols;
    int64_t row_stride, col_stride;
  };
  Map maps[4];
  // sizes fit int32, K and N are multiples of 16 (CheckLinearSupported): valid TMA extents and 16-byte row strides
  const struct {
    const void* base;
    int64_t rows, cols, box_rows;
    const char* name;
  } specs[4] = {{l.x, l.T, l.K, im.block_m, "X"},
                {l.w, l.N, l.K, im.block_n, "W"},
                {l.residual != nullptr ? l.residual : l.y, l.T, l.N, im.block_m, "Residual"},
                {l.y, l.T, l.N, im.block_m, "Y"}};
  for (int i = 0; i < 4; ++i) {
    std::string err = EncodeTmaTiled2D(&maps[i].map, type, specs[i].base, static_cast<uint64_t>(specs[i].cols),
                                       static_cast<uint64_t>(specs[i].rows), kBoxCols,
                                       static_cast<uint32_t>(specs[i].box_rows), specs[i].name);
    if (!err.empty()) return err;
    maps[i].rows = static_cast<int32_t>(specs[i].rows);
    maps[i].cols = static_cast<int32_t>(specs[i].cols);
    maps[i].row_stride = specs[i].cols;
    maps[i].col_stride = 1;
  }
  LinearScalars s(l);
  // sm_count and programs_per_sm are small (a device attribute, the build table): the product cannot overflow
  const int64_t slots = static_cast<int64_t>(sm_count) * (im.programs_per_sm > 0 ? im.programs_per_sm : 1);
  int32_t programs = static_cast<int32_t>(tiles < slots ? tiles : slots);
  CUdeviceptr scratch = 0, profile_scratch = 0;
  void* args[] = {&maps[0].map, &maps[0].rows, &maps[0].cols, &maps[0].row_stride, &maps[0].col_stride,
                  &maps[1].map, &maps[1].rows, &maps[1].cols, &maps[1].row_stride, &maps[1].col_stride,
                  &maps[2].map, &maps[2].rows, &maps[2].cols, &maps[2].row_stride, &maps[2].col_stride,
                  &maps[3].map, &maps[3].rows, &maps[3].cols, &maps[3].row_stride, &maps[3].col_stride,
                  &bias,        &cu,           &s.T,          &s.N,                &s.K,
                  &s.B,         &s.has_bias,   &s.has_res,    &s.has_live,         &s.activation,
                  &programs,    &scratch,      &profile_scratch};
  return LaunchChecked(l, im, fn, programs, args, static_cast<int>(sizeof(args) / sizeof(void*)));
}

std::string Sizes(const LinearLaunch& l) {
  return "T = " + std::to_string(l.T) + ", N = " + std::to_string(l.N) + ", K = " + std::to_string(l.K) +
         ", B = " + std::to_string(l.B);
}

}  // namespace

LinearConfig PreferredLinearConfig(int64_t T, int64_t N, int arch, bool has_live) {
  if (T >= kLinearLargeT && arch >= kLinearTmaMinArch) return LinearConfig::kTma;
  if (T >= kLinearLargeT && has_live && N <= kLinearCapacityNarrowN) return LinearConfig::kSmallWide;
  if (T >= kLinearLargeT) return LinearConfig::kXLarge;  // sm_90; the image pick falls back to kLarge elsewhere
  return N <= kLinearNarrowN ? LinearConfig::kSmallNarrow : LinearConfig::kSmallWide;
}

std::string CheckLinearSupported(const LinearLaunch& l) {
  if (l.T < 0 || l.N < 0 || l.K < 0 || l.B < 0) return "sizes must be >= 0, got " + Sizes(l);
  if (l.dtype != DType::kFloat16 && l.dtype != DType::kBFloat16) {
    return std::string("element type ") + DTypeName(l.dtype) + " has no CUDA kernel (float16 and bfloat16 do)";
  }
  if (l.K % 16 != 0 || l.N % 16 != 0) {
    return "K = " + std::to_string(l.K) + " and N = " + std::to_string(l.N) +
           " must be multiples of 16 on the CUDA EP (the AOT cubins assume 16-divisible K and N)";
  }
  if (l.T > kMaxRowsCols || l.N > kMaxRowsCols || l.K >= kInt32Limit || l.B >= kInt32Limit) {
    return Sizes(l) + " exceed the int32 sizes of the kernel";
  }
  if (l.activation != 0 && l.activation != 1) return "activation must be 0 or 1, got " + std::to_string(l.activation);
  const void* ptrs[] = {l.x, l.w, l.bias, l.residual, l.cu, l.y};
  const char* names[] = {"X", "W", "Bias", "Residual", "CuSeqlens", "Y"};
  for (int i = 0; i < 6; ++i) {
    if (reinterpret_cast<uintptr_t>(ptrs[i]) % 16 != 0) {
      return std::string("device buffer '") + names[i] + "' is not 16-byte aligned";
    }
  }
  return "";
}

std::string LaunchRaggedLinear(const LinearLaunch& l) {
  std::string err = CheckLinearSupported(l);
  if (!err.empty()) return err;
  if (l.T == 0 || l.N == 0) return "";  // empty Y: nothing to launch
  err = DriverError();
  if (!err.empty()) return err;
  LinearConfig want = LinearConfig::kSmallNarrow;
  CUfunction fn = nullptr;
  long index = -1;
  int sm_count = 0;
  LaunchScope scope;
  err = EnterContext(l.stream, l.device_ordinal, scope, [&](int arch, const LoadFn& load) -> std::string {
    want = PreferredLinearConfig(l.T, l.N, arch, l.cu != nullptr);
    index = PickLinearImage(l, want, arch);
    if (index < 0) {
      return std::string("no RaggedLinear cubin for sm_") + std::to_string(arch) + " " + DTypeName(l.dtype) +
             (l.index_type == IndexType::kInt32 ? "/int32" : "/int64") + " config " + ConfigName(want) +
             " or smaller in this library (rebuild with build.py --archs)";
    }
    const LinearImage& im = kLinearImages[index];
    if (im.tma) {
      std::string e = CurrentMultiprocessorCount(&sm_count);
      if (!e.empty()) return e;
    }
    return load(CubinRef{im.cubin, im.function_name, im.shared_bytes}, &fn);
  });
  if (!err.empty()) return err;

  const LinearImage& im = kLinearImages[index];
  // programs = cdiv(T, BLOCK_M) * cdiv(N, BLOCK_N): the kernel's program id is int32
  const int64_t grid_m = (l.T + im.block_m - 1) / im.block_m, grid_n = (l.N + im.block_n - 1) / im.block_n;
  int64_t programs = 0;
  if (__builtin_mul_overflow(grid_m, grid_n, &programs) || programs >= kInt32Limit) {
    return Sizes(l) + ": cdiv(T, " + std::to_string(im.block_m) + ") * cdiv(N, " + std::to_string(im.block_n) +
           ") programs exceed the int32 grid of the kernel";
  }
  // absent optional inputs: X's pointer stands in (never read: has_bias / has_res / has_live = 0)
  CUdeviceptr x = reinterpret_cast<CUdeviceptr>(l.x), w = reinterpret_cast<CUdeviceptr>(l.w);
  CUdeviceptr bias = reinterpret_cast<CUdeviceptr>(l.bias != nullptr ? l.bias : l.x);
  CUdeviceptr res = reinterpret_cast<CUdeviceptr>(l.residual != nullptr ? l.residual : l.x);
  CUdeviceptr cu = reinterpret_cast<CUdeviceptr>(l.cu != nullptr ? l.cu : l.x);
  CUdeviceptr y = reinterpret_cast<CUdeviceptr>(l.y), scratch = 0, profile_scratch = 0;
  if (im.tma) return LaunchTma(l, im, fn, programs, sm_count, bias, cu);
  LinearScalars s(l);
  void* args[] = {&x,   &w,   &bias,       &res,       &cu,         &y,            &s.T,     &s.N,
                  &s.K, &s.B, &s.has_bias, &s.has_res, &s.has_live, &s.activation, &scratch, &profile_scratch};
  return LaunchChecked(l, im, fn, programs, args, static_cast<int>(sizeof(args) / sizeof(void*)));
}

}  // namespace raggedvit::cuda

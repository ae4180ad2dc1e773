// Loads libcuda.so.1 at run time, picks the cubin for the device's compute capability, loads it once per
// CUDA context (thread-safe cache) and enqueues the Triton kernels with cuLaunchKernel.
#include "launcher.h"

#include <dlfcn.h>

#include "launch_context.h"

#include <cstring>
#include <map>
#include <mutex>
#include <utility>

#include "cuda.h"  // types only (from the triton wheel: triton/backends/nvidia/include)

namespace raggedvit::cuda {

namespace {

struct Driver {
  bool ok = false;
  std::string error;
  CUresult (*Init)(unsigned int) = nullptr;
  CUresult (*DeviceGetCount)(int*) = nullptr;
  CUresult (*DeviceGet)(CUdevice*, int) = nullptr;
  CUresult (*DeviceGetAttribute)(int*, CUdevice_attribute, CUdevice) = nullptr;
  CUresult (*DevicePrimaryCtxRetain)(CUcontext*, CUdevice) = nullptr;
  CUresult (*CtxGetCurrent)(CUcontext*) = nullptr;
  CUresult (*CtxPushCurrent)(CUcontext) = nullptr;
  CUresult (*CtxPopCurrent)(CUcontext*) = nullptr;
  CUresult (*CtxGetDevice)(CUdevice*) = nullptr;
  CUresult (*StreamGetCtx)(CUstream, CUcontext*) = nullptr;
  CUresult (*ModuleLoadData)(CUmodule*, const void*) = nullptr;
  CUresult (*ModuleGetFunction)(CUfunction*, CUmodule, const char*) = nullptr;
  CUresult (*FuncSetAttribute)(CUfunction, CUfunction_attribute, int) = nullptr;
  CUresult (*LaunchKernel)(CUfunction, unsigned int, unsigned int, unsigned int, unsigned int, unsigned int,
                           unsigned int, unsigned int, CUstream, void**, void**) = nullptr;
  CUresult (*GetErrorName)(CUresult, const char**) = nullptr;
  // optional (drivers before CUDA 12 lack it): only the TMA linear kernel needs it
  CUresult (*TensorMapEncodeTiled)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                   const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                   CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill) = nullptr;
};

template <typename F>
bool Bind(void* lib, const char* name, F* fn, std::string* missing) {
  *fn = reinterpret_cast<F>(dlsym(lib, name));
  if (*fn == nullptr) *missing += std::string(missing->empty() ? "" : ", ") + name;
  return *fn != nullptr;
}

const Driver& GetDriver() {
  static Driver drv;
  static std::once_flag once;
  std::call_once(once, [] {
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
      const char* e = dlerror();
      drv.error = std::string("cannot load libcuda.so.1: ") + (e ? e : "unknown dlopen error");
      return;
    }
    std::string missing;
    Bind(lib, "cuInit", &drv.Init, &missing);
    Bind(lib, "cuDeviceGetCount", &drv.DeviceGetCount, &missing);
    Bind(lib, "cuDeviceGet", &drv.DeviceGet, &missing);
    Bind(lib, "cuDeviceGetAttribute", &drv.DeviceGetAttribute, &missing);
    Bind(lib, "cuDevicePrimaryCtxRetain", &drv.DevicePrimaryCtxRetain, &missing);
    Bind(lib, "cuCtxGetCurrent", &drv.CtxGetCurrent, &missing);
    Bind(lib, "cuCtxPushCurrent_v2", &drv.CtxPushCurrent, &missing);
    Bind(lib, "cuCtxPopCurrent_v2", &drv.CtxPopCurrent, &missing);
    Bind(lib, "cuCtxGetDevice", &drv.CtxGetDevice, &missing);
    Bind(lib, "cuStreamGetCtx", &drv.StreamGetCtx, &missing);
    Bind(lib, "cuModuleLoadData", &drv.ModuleLoadData, &missing);
    Bind(lib, "cuModuleGetFunction", &drv.ModuleGetFunction, &missing);
    Bind(lib, "cuFuncSetAttribute", &drv.FuncSetAttribute, &missing);
    Bind(lib, "cuLaunchKernel", &drv.LaunchKernel, &missing);
    Bind(lib, "cuGetErrorName", &drv.GetErrorName, &missing);
    std::string optional;
    Bind(lib, "cuTensorMapEncodeTiled", &drv.TensorMapEncodeTiled, &optional);
    if (!missing.empty()) {
      drv.error = "libcuda.so.1 lacks " + missing;
      return;
    }
    CUresult r = drv.Init(0);
    int count = 0;
    if (r == CUDA_SUCCESS) r = drv.DeviceGetCount(&count);
    if (r != CUDA_SUCCESS || count == 0) {
      drv.error = "no usable CUDA device (cuInit/cuDeviceGetCount)";
      return;
    }
    drv.ok = true;
  });
  return drv;
}

std::string ErrorText(const char* call, CUresult r) {
  const char* name = nullptr;
  const Driver& drv = GetDriver();
  if (drv.GetErrorName == nullptr || drv.GetErrorName(r, &name) != CUDA_SUCCESS || name == nullptr) {
    name = "CUDA_ERROR_UNKNOWN";
  }
  return std::string(call) + " failed: " + name + " (" + std::to_string(static_cast<int>(r)) + ")";
}

struct ContextState {
  int arch = 0;
  int shared_optin = 0;
  std::map<const unsigned char*, CUfunction> functions;  // cubin -> its loaded function
};

std::mutex g_mutex;
std::map<CUcontext, ContextState> g_contexts;
std::map<int, CUcontext> g_primary;  // device ordinal -> retained primary context

// Picks the image for the device arch and T: same major and highest minor <= the device's (SASS is not
// forward compatible across majors), then the config with the largest min_tokens <= T (the rule of
// raggedvit/kernels/_config.py:pick_config). Returns -1 when none fits.
long PickImage(KernelKind kind, const AttentionLaunch& a, int block_d, int arch) {
  long best = -1;
  for (size_t i = 0; i < kNumKernelImages; ++i) {
    const KernelImage& im = kKernelImages[i];
    if (im.kind != kind || im.dtype != a.dtype || im.index_type != a.index_type || im.block_d != block_d) continue;
    if (im.has_pos != (a.pos_table != nullptr) || im.has_key_bias != (a.key_bias != nullptr)) continue;
    if (im.arch / 10 != arch / 10 || im.arch > arch || im.min_tokens > a.T) continue;
    if (best < 0) {
      best = static_cast<long>(i);
      continue;
    }
    const KernelImage& b = kKernelImages[best];
    if (im.arch > b.arch || (im.arch == b.arch && im.min_tokens > b.min_tokens)) best = static_cast<long>(i);
  }
  return best;
}

std::string AvailableArchs() {
  std::map<int, bool> archs;
  for (size_t i = 0; i < kNumKernelImages; ++i) archs[kKernelImages[i].arch] = true;
  std::string s;
  for (const auto& [arch, _] : archs) s += (s.empty() ? "sm_" : ", sm_") + std::to_string(arch);
  return s.empty() ? "none" : s;
}

// Loads (once per context) the function of a cubin; call with g_mutex held and ctx current.
std::string GetFunction(ContextState& st, const CubinRef& im, CUfunction* fn) {
  auto it = st.functions.find(im.cubin);
  if (it != st.functions.end()) {
    *fn = it->second;
    return "";
  }
  const Driver& drv = GetDriver();
  CUmodule mod = nullptr;
  CUresult r = drv.ModuleLoadData(&mod, im.cubin);
  if (r != CUDA_SUCCESS) return ErrorText("cuModuleLoadData", r);
  r = drv.ModuleGetFunction(fn, mod, im.function_name);
  if (r != CUDA_SUCCESS) return ErrorText("cuModuleGetFunction", r);
  if (im.shared_bytes > 48 * 1024) {
    if (im.shared_bytes > st.shared_optin) {
      return std::string(im.function_name) + " needs " + std::to_string(im.shared_bytes) +
             " bytes of shared memory; the device allows " + std::to_string(st.shared_optin);
    }
    r = drv.FuncSetAttribute(*fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, im.shared_bytes);
    if (r != CUDA_SUCCESS) return ErrorText("cuFuncSetAttribute", r);
  }
  st.functions.emplace(im.cubin, *fn);
  return "";
}

// Context of the launch: the stream's, else the device's primary context. Call with g_mutex held.
std::string ResolveContext(void* stream, int device_ordinal, CUcontext* ctx) {
  const Driver& drv = GetDriver();
  if (stream != nullptr) {
    CUresult r = drv.StreamGetCtx(static_cast<CUstream>(stream), ctx);
    return r == CUDA_SUCCESS ? "" : ErrorText("cuStreamGetCtx", r);
  }
  auto it = g_primary.find(device_ordinal);
  if (it != g_primary.end()) {
    *ctx = it->second;
    return "";
  }
  CUdevice dev = 0;
  CUresult r = drv.DeviceGet(&dev, device_ordinal);
  if (r != CUDA_SUCCESS) return ErrorText("cuDeviceGet", r);
  r = drv.DevicePrimaryCtxRetain(ctx, dev);
  if (r != CUDA_SUCCESS) return ErrorText("cuDevicePrimaryCtxRetain", r);
  g_primary[device_ordinal] = *ctx;
  return "";
}

std::string InitContextState(ContextState& st) {
  const Driver& drv = GetDriver();
  CUdevice dev = 0;
  CUresult r = drv.CtxGetDevice(&dev);
  if (r != CUDA_SUCCESS) return ErrorText("cuCtxGetDevice", r);
  int major = 0, minor = 0;
  r = drv.DeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev);
  if (r == CUDA_SUCCESS) r = drv.DeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev);
  if (r == CUDA_SUCCESS) {
    r = drv.DeviceGetAttribute(&st.shared_optin, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, dev);
  }
  if (r != CUDA_SUCCESS) return ErrorText("cuDeviceGetAttribute", r);
  st.arch = major * 10 + minor;
  return "";
}

CubinRef RefOf(const KernelImage& im) { return {im.cubin, im.function_name, im.shared_bytes}; }

}  // namespace

LaunchScope::~LaunchScope() {
  if (pushed) {
    CUcontext prev = nullptr;
    GetDriver().CtxPopCurrent(&prev);
  }
}

std::string DriverError() {
  const Driver& drv = GetDriver();
  return drv.ok ? "" : drv.error;
}

std::string EnterContext(void* stream, int device_ordinal, LaunchScope& scope, const PickFn& pick) {
  const Driver& drv = GetDriver();
  std::lock_guard<std::mutex> lock(g_mutex);
  CUcontext ctx = nullptr, current = nullptr;
  std::string err = ResolveContext(stream, device_ordinal, &ctx);
  if (!err.empty()) return err;
  CUresult r = drv.CtxGetCurrent(&current);
  if (r != CUDA_SUCCESS) return ErrorText("cuCtxGetCurrent", r);
  if (current != ctx) {
    r = drv.CtxPushCurrent(ctx);
    if (r != CUDA_SUCCESS) return ErrorText("cuCtxPushCurrent", r);
    scope.pushed = true;
  }
  auto [it, inserted] = g_contexts.try_emplace(ctx);
  ContextState& st = it->second;
  if (inserted) {
    err = InitContextState(st);
    if (!err.empty()) {
      g_contexts.erase(it);
      return err;
    }
  }
  return pick(st.arch, [&st](const CubinRef& ref, CUfunction* fn) { return GetFunction(st, ref, fn); });
}

std::string Launch(CUfunction fn, unsigned grid_x, unsigned grid_y, int num_warps, int shared_bytes, void* stream,
                   void** args, const char* what) {
  CUresult r = GetDriver().LaunchKernel(fn, grid_x, grid_y, 1, 32u * static_cast<unsigned>(num_warps), 1, 1,
                                        static_cast<unsigned>(shared_bytes), static_cast<CUstream>(stream), args,
                                        nullptr);
  return r == CUDA_SUCCESS ? "" : ErrorText((std::string("cuLaunchKernel(") + what + ")").c_str(), r);
}

std::string CurrentMultiprocessorCount(int* count) {
  const Driver& drv = GetDriver();
  CUdevice dev = 0;
  CUresult r = drv.CtxGetDevice(&dev);
  if (r != CUDA_SUCCESS) return ErrorText("cuCtxGetDevice", r);
  r = drv.DeviceGetAttribute(count, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev);
  return r == CUDA_SUCCESS ? "" : ErrorText("cuDeviceGetAttribute(MULTIPROCESSOR_COUNT)", r);
}

std::string EncodeTmaTiled2D(CUtensorMap* map, CUtensorMapDataType type, const void* base, uint64_t cols,
                             uint64_t rows, uint32_t box_cols, uint32_t box_rows, const char* what) {
  const Driver& drv = GetDriver();
  if (drv.TensorMapEncodeTiled == nullptr) return "libcuda.so.1 lacks cuTensorMapEncodeTiled (a CUDA 12 driver)";
  const cuuint64_t dims[2] = {cols, rows};
  const cuuint64_t strides[1] = {cols * 2};  // bytes between rows (2-byte elements)
  const cuuint32_t box[2] = {box_cols, box_rows};
  const cuuint32_t element_strides[2] = {1, 1};
  CUresult r = drv.TensorMapEncodeTiled(map, type, 2, const_cast<void*>(base), dims, strides, box, element_strides,
                                        CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                        CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r == CUDA_SUCCESS) return "";
  return ErrorText((std::string("cuTensorMapEncodeTiled(") + what + " [" + std::to_string(rows) + ", " +
                    std::to_string(cols) + "], box " + std::to_string(box_rows) + " x " + std::to_string(box_cols) +
                    ")").c_str(),
                   r);
}

const char* DTypeName(DType t) {
  return t == DType::kFloat32 ? "fp32" : (t == DType::kFloat16 ? "fp16" : "bf16");
}

bool DriverAvailable() { return GetDriver().ok; }

int BlockDFor(int64_t D) {
  int best = 0;
  for (size_t i = 0; i < kNumKernelImages; ++i) {
    const int b = kKernelImages[i].block_d;
    if (b >= D && (best == 0 || b < best)) best = b;
  }
  return best;
}

std::string CheckSupported(const AttentionLaunch& a) {
  if (a.T < 0 || a.B < 0 || a.H < 1 || a.D < 1) {
    return "sizes must be T >= 0, B >= 0, H >= 1, D >= 1, got T = " + std::to_string(a.T) + ", B = " +
           std::to_string(a.B) + ", H = " + std::to_string(a.H) + ", D = " + std::to_string(a.D);
  }
  const int block_d = BlockDFor(a.D);
  if (a.D % 16 != 0 || a.D < 32 || block_d == 0) {  // BLOCK_D = next power of two >= D, in the table
    return "head dim D = " + std::to_string(a.D) +
           " is not supported by the CUDA kernels (AOT build ships D % 16 == 0, 32 <= D <= 128)";
  }
  // T*3*H*D in 64-bit, each step overflow-checked: the kernel indexes qkv with int32
  int64_t elements = 0;
  const bool fits = __builtin_mul_overflow(a.T, a.H, &elements) == 0 &&
                    __builtin_mul_overflow(elements, a.D, &elements) == 0 &&
                    __builtin_mul_overflow(elements, int64_t{3}, &elements) == 0;
  if (!fits || elements >= (int64_t{1} << 31) || a.B >= (int64_t{1} << 31)) {
    return "T * 3 * H * D = " + std::to_string(a.T) + " * 3 * " + std::to_string(a.H) + " * " + std::to_string(a.D) +
           " elements (B = " + std::to_string(a.B) + ") exceed the int32 indexing of the kernel";
  }
  if (a.H > 65535) return "num_heads = " + std::to_string(a.H) + " exceeds the CUDA grid limit 65535";
  if ((a.pos_table == nullptr) != (a.token_pos == nullptr)) return "pos_table and token_pos go together";
  if (a.pos_table != nullptr) {
    // the kernel computes h*R + column and num_prefix + grid_h*grid_w in int32; every step checked in 64-bit
    int64_t h2 = 0, w2 = 0, r = 0, table = 0, area = 0, end = 0;
    const bool ok = a.grid_h >= 1 && a.grid_w >= 1 && a.num_prefix >= 0 &&
                    __builtin_mul_overflow(a.grid_h, int64_t{2}, &h2) == 0 &&
                    __builtin_mul_overflow(a.grid_w, int64_t{2}, &w2) == 0 &&
                    __builtin_mul_overflow(h2 - 1, w2 - 1, &r) == 0 && __builtin_add_overflow(r, int64_t{3}, &r) == 0 &&
                    __builtin_mul_overflow(r, a.H, &table) == 0 &&
                    __builtin_mul_overflow(a.grid_h, a.grid_w, &area) == 0 &&
                    __builtin_add_overflow(area, a.num_prefix, &end) == 0;
    if (!ok || table >= (int64_t{1} << 31) || end >= (int64_t{1} << 31)) {
      return "relative position grid " + std::to_string(a.grid_h) + "x" + std::to_string(a.grid_w) +
             " (num_prefix = " + std::to_string(a.num_prefix) + ", H = " + std::to_string(a.H) +
             "): H*((2*grid_h-1)*(2*grid_w-1)+3) and num_prefix + grid_h*grid_w must be in the kernel's int32 range";
    }
  }
  const void* ptrs[] = {a.qkv, a.cu, a.out, a.lse, a.cls_attn, a.bias, a.pos_table, a.token_pos, a.key_bias};
  const char* names[] = {"qkv", "cu_seqlens", "out", "lse scratch", "cls_attn", "bias", "pos_table", "token_pos",
                         "key_bias"};
  for (int i = 0; i < 9; ++i) {
    if (reinterpret_cast<uintptr_t>(ptrs[i]) % 16 != 0) {
      return std::string("device buffer '") + names[i] + "' is not 16-byte aligned";
    }
  }
  if (a.cls_attn != nullptr && a.lse == nullptr) return "cls_attn requested without an lse scratch buffer";
  return "";
}

std::string LaunchRaggedAttention(const AttentionLaunch& a) {
  if (a.T == 0) return "";  // empty grid: nothing to launch
  std::string err = CheckSupported(a);
  if (!err.empty()) return err;
  err = DriverError();
  if (!err.empty()) return err;
  const int block_d = BlockDFor(a.D);

  CUfunction fwd = nullptr, cls = nullptr;
  long fwd_index = -1, cls_index = -1;
  LaunchScope scope;
  err = EnterContext(a.stream, a.device_ordinal, scope, [&](int arch, const LoadFn& load) -> std::string {
    fwd_index = PickImage(KernelKind::kForward, a, block_d, arch);
    cls_index = PickImage(KernelKind::kClsAttn, a, block_d, arch);
    if (fwd_index < 0 || cls_index < 0) {
      return std::string("no cubin for sm_") + std::to_string(arch) + " " + DTypeName(a.dtype) +
             (a.index_type == IndexType::kInt32 ? "/int32" : "/int64") + " BLOCK_D=" + std::to_string(block_d) +
             (a.pos_table != nullptr ? " with relative position bias" : "") +
             (a.key_bias != nullptr ? " with key bias" : "") +
             " in this library (it holds " + AvailableArchs() + "; rebuild with build.py --archs)";
    }
    std::string e = load(RefOf(kKernelImages[fwd_index]), &fwd);
    if (e.empty() && a.cls_attn != nullptr) e = load(RefOf(kKernelImages[cls_index]), &cls);
    return e;
  });
  if (!err.empty()) return err;

  CUdeviceptr qkv = reinterpret_cast<CUdeviceptr>(a.qkv), cu = reinterpret_cast<CUdeviceptr>(a.cu);
  // no bias: qkv's pointer stands in (never read, has_bias = 0)
  CUdeviceptr bias = reinterpret_cast<CUdeviceptr>(a.bias != nullptr ? a.bias : a.qkv);
  int32_t has_bias = a.bias != nullptr ? 1 : 0;
  CUdeviceptr out = reinterpret_cast<CUdeviceptr>(a.out), lse = reinterpret_cast<CUdeviceptr>(a.lse);
  CUdeviceptr cls_attn = reinterpret_cast<CUdeviceptr>(a.cls_attn), scratch = 0, profile_scratch = 0;
  // no relative position bias: qkv's and cu's pointers stand in (never read, HAS_POS = false in that cubin)
  CUdeviceptr pos_table = reinterpret_cast<CUdeviceptr>(a.pos_table != nullptr ? a.pos_table : a.qkv);
  CUdeviceptr token_pos = reinterpret_cast<CUdeviceptr>(a.token_pos != nullptr ? a.token_pos : a.cu);
  // no key bias: qkv's pointer stands in (never read, HAS_KEY_BIAS = false in that cubin)
  CUdeviceptr key_bias = reinterpret_cast<CUdeviceptr>(a.key_bias != nullptr ? a.key_bias : a.qkv);
  int32_t grid_h = static_cast<int32_t>(a.grid_h), grid_w = static_cast<int32_t>(a.grid_w);
  int32_t num_prefix = static_cast<int32_t>(a.num_prefix);
  int32_t T = static_cast<int32_t>(a.T), B = static_cast<int32_t>(a.B);
  int32_t H = static_cast<int32_t>(a.H), D = static_cast<int32_t>(a.D);
  int32_t scale_bits = 0, store_lse = a.cls_attn != nullptr ? 1 : 0;
  std::memcpy(&scale_bits, &a.scale, sizeof(scale_bits));

  const KernelImage& f = kKernelImages[fwd_index];
  // the forward kernel's grid (kernels/_config.py fwd_grid): J = cdiv(cdiv(T, B), BLOCK_M) programs per sequence,
  // then cdiv(T, kDeadTilesPerProgram * BLOCK_M) for the dead rows; all of it int32 in the kernel (checked)
  constexpr int64_t kDeadTilesPerProgram = 4;
  if (f.block_m < 1) return std::string(f.function_name) + ": BLOCK_M must be >= 1";
  const int64_t per_seq = (a.T + std::max<int64_t>(a.B, 1) - 1) / std::max<int64_t>(a.B, 1);
  const int64_t tiles_per_seq = std::max<int64_t>(1, (per_seq + f.block_m - 1) / f.block_m);
  const int64_t dead_programs = (a.T + kDeadTilesPerProgram * f.block_m - 1) / (kDeadTilesPerProgram * f.block_m);
  int64_t seq_programs = 0, fwd_programs = 0;
  if (__builtin_mul_overflow(a.B, tiles_per_seq, &seq_programs) ||
      __builtin_add_overflow(seq_programs, dead_programs, &fwd_programs) || fwd_programs > (int64_t{1} << 31) - 1) {
    return "T = " + std::to_string(a.T) + ", B = " + std::to_string(a.B) + ": B * " + std::to_string(tiles_per_seq) +
           " + " + std::to_string(dead_programs) + " query-tile programs exceed the CUDA grid limit 2^31 - 1";
  }
  int32_t J = static_cast<int32_t>(tiles_per_seq);
  void* fwd_args[] = {&qkv,        &bias,     &cu,     &out,    &lse,    &pos_table,  &token_pos, &key_bias,
                      &T,          &B,        &J,      &H,      &D,      &scale_bits, &store_lse, &has_bias,
                      &grid_h,     &grid_w,   &num_prefix, &scratch, &profile_scratch};
  constexpr int kFwdParams = static_cast<int>(sizeof(fwd_args) / sizeof(void*));
  if (f.num_params != kFwdParams) {
    return std::string(f.function_name) + ": cubin expects " + std::to_string(f.num_params) +
           " parameters, launcher passes " + std::to_string(kFwdParams);
  }
  const unsigned fwd_grid = static_cast<unsigned>(fwd_programs);
  err = Launch(fwd, fwd_grid, static_cast<unsigned>(a.H), f.num_warps, f.shared_bytes, a.stream, fwd_args,
               "_ragged_attn_fwd");
  if (!err.empty()) return err;

  if (a.cls_attn != nullptr) {
    const KernelImage& c = kKernelImages[cls_index];
    void* cls_args[] = {&qkv,    &bias,   &cu,         &lse,    &cls_attn, &pos_table, &token_pos, &key_bias,
                        &T,      &B,      &H,          &D,      &scale_bits, &has_bias, &grid_h,
                        &grid_w, &num_prefix, &scratch, &profile_scratch};
    constexpr int kClsParams = static_cast<int>(sizeof(cls_args) / sizeof(void*));
    if (c.num_params != kClsParams) {
      return std::string(c.function_name) + ": cubin expects " + std::to_string(c.num_params) +
             " parameters, launcher passes " + std::to_string(kClsParams);
    }
    const unsigned cls_grid = static_cast<unsigned>((a.T + c.block_n - 1) / c.block_n);
    err = Launch(cls, cls_grid, 1, c.num_warps, c.shared_bytes, a.stream, cls_args, "_ragged_cls_attn");
    if (!err.empty()) return err;
  }
  return "";
}

}  // namespace raggedvit::cuda

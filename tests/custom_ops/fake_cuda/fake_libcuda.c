/* A fake libcuda.so.1 for testing cuda/launcher.cc on machines without a GPU.
 * It appends one line per driver call the launcher makes to $FAKE_CUDA_LOG and refuses launches whose
 * stream context is not current. Behaviour from the environment:
 *   FAKE_CUDA_ARCH (default 90), FAKE_CUDA_DEVICES (default 1), FAKE_CUDA_SMEM_OPTIN (default 232448),
 *   FAKE_CUDA_LAUNCH_ERR / FAKE_CUDA_LOAD_ERR: CUresult returned by cuLaunchKernel / cuModuleLoadData.
 * A "cubin" here is a NUL-terminated tag string; streams encode their device in the low 4 bits.
 */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
typedef int CUdevice;
typedef void* CUcontext;
typedef void* CUstream;
typedef void* CUmodule;
typedef struct {
  char tag[128];
  char name[64];
} FakeFunction;

static CUcontext g_stack[16];
static int g_depth = 0;

static int env_int(const char* name, int fallback) {
  const char* v = getenv(name);
  return v ? atoi(v) : fallback;
}

static void log_line(const char* fmt, ...) {
  const char* path = getenv("FAKE_CUDA_LOG");
  if (!path) return;
  FILE* f = fopen(path, "a");
  if (!f) return;
  va_list ap;
  va_start(ap, fmt);
  vfprintf(f, fmt, ap);
  va_end(ap);
  fputc('\n', f);
  fclose(f);
}

static CUcontext ctx_of_device(int dev) { return (CUcontext)(uintptr_t)(0x1000 + dev); }
static int device_of_ctx(CUcontext c) { return c ? (int)((uintptr_t)c - 0x1000) : -1; }
static CUcontext current(void) { return g_depth ? g_stack[g_depth - 1] : NULL; }

CUresult cuInit(unsigned int flags) {
  (void)flags;
  return env_int("FAKE_CUDA_INIT_ERR", 0);
}
CUresult cuDeviceGetCount(int* n) {
  *n = env_int("FAKE_CUDA_DEVICES", 1);
  return 0;
}
CUresult cuDeviceGet(CUdevice* d, int ordinal) {
  if (ordinal >= env_int("FAKE_CUDA_DEVICES", 1)) return 101; /* CUDA_ERROR_INVALID_DEVICE */
  *d = ordinal;
  return 0;
}
CUresult cuDeviceGetAttribute(int* v, int attr, CUdevice d) {
  (void)d;
  int arch = env_int("FAKE_CUDA_ARCH", 90);
  if (attr == 75) *v = arch / 10;      /* CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR */
  else if (attr == 76) *v = arch % 10; /* ..._MINOR */
  else if (attr == 97) *v = env_int("FAKE_CUDA_SMEM_OPTIN", 232448); /* ..._MAX_SHARED_MEMORY_PER_BLOCK_OPTIN */
  else if (attr == 16) *v = env_int("FAKE_CUDA_SMS", 132);            /* ..._MULTIPROCESSOR_COUNT */
  else return 1;
  return 0;
}
CUresult cuDevicePrimaryCtxRetain(CUcontext* c, CUdevice d) {
  *c = ctx_of_device(d);
  log_line("retain %d", d);
  return 0;
}
CUresult cuCtxGetCurrent(CUcontext* c) {
  *c = current();
  return 0;
}
CUresult cuCtxPushCurrent_v2(CUcontext c) {
  g_stack[g_depth++] = c;
  log_line("push %d", device_of_ctx(c));
  return 0;
}
CUresult cuCtxPopCurrent_v2(CUcontext* c) {
  if (!g_depth) return 201;
  *c = g_stack[--g_depth];
  log_line("pop %d", device_of_ctx(*c));
  return 0;
}
CUresult cuCtxGetDevice(CUdevice* d) {
  if (!g_depth) return 201; /* CUDA_ERROR_INVALID_CONTEXT */
  *d = device_of_ctx(current());
  return 0;
}
CUresult cuStreamGetCtx(CUstream s, CUcontext* c) {
  *c = ctx_of_device((int)((uintptr_t)s & 0xf));
  return 0;
}
CUresult cuModuleLoadData(CUmodule* m, const void* image) {
  int err = env_int("FAKE_CUDA_LOAD_ERR", 0);
  if (err) return err;
  *m = (CUmodule)image;
  log_line("load %s ctx=%d", (const char*)image, device_of_ctx(current()));
  return 0;
}
CUresult cuModuleGetFunction(void** f, CUmodule m, const char* name) {
  FakeFunction* fn = (FakeFunction*)calloc(1, sizeof(FakeFunction));
  snprintf(fn->tag, sizeof fn->tag, "%s", (const char*)m);
  snprintf(fn->name, sizeof fn->name, "%s", name);
  *f = fn;
  return 0;
}
CUresult cuFuncSetAttribute(void* f, int attr, int value) {
  log_line("setattr %s attr=%d value=%d", ((FakeFunction*)f)->tag, attr, value);
  return 0;
}
/* A fake tensor map: base, cols, rows, box cols, box rows, element type, swizzle, as 7 uint64 (of the real 128
 * bytes), printed by a _ragged_linear_tma launch. */
CUresult cuTensorMapEncodeTiled(void* map, int type, unsigned rank, void* base, const uint64_t* dims,
                                const uint64_t* strides, const unsigned* box, const unsigned* elem_strides,
                                int interleave, int swizzle, int l2, int oob) {
  (void)elem_strides, (void)interleave, (void)l2, (void)oob;
  int err = env_int("FAKE_CUDA_TMA_ERR", 0);
  if (err) return err;
  if (rank != 2 || strides[0] != dims[0] * 2) return 1;
  uint64_t* m = (uint64_t*)map;
  m[0] = (uint64_t)(uintptr_t)base, m[1] = dims[0], m[2] = dims[1], m[3] = box[0], m[4] = box[1];
  m[5] = (uint64_t)type, m[6] = (uint64_t)swizzle;
  return 0;
}

static int print_tma_linear(char* args, size_t size, void** params) {
  /* per descriptor (X, W, Residual, Y): the map, 2 int32 sizes, 2 int64 strides; then Bias and CU, 9 int32s, 2
     scratch pointers */
  int pos = 0;
  for (int d = 0; d < 4; ++d) {
    const uint64_t* m = (const uint64_t*)params[5 * d];
    pos += snprintf(args + pos, size - pos, "%smap(%llx,%llu,%llu,%llu,%llu,t%llu,s%llu),%d,%d,%lld,%lld",
                    d ? "," : "", (unsigned long long)m[0], (unsigned long long)m[1], (unsigned long long)m[2],
                    (unsigned long long)m[3], (unsigned long long)m[4], (unsigned long long)m[5],
                    (unsigned long long)m[6], *(int32_t*)params[5 * d + 1], *(int32_t*)params[5 * d + 2],
                    (long long)*(int64_t*)params[5 * d + 3], (long long)*(int64_t*)params[5 * d + 4]);
  }
  for (int i = 20; i < 22; ++i) pos += snprintf(args + pos, size - pos, ",%llx", *(unsigned long long*)params[i]);
  for (int i = 22; i < 31; ++i) pos += snprintf(args + pos, size - pos, ",%d", *(int32_t*)params[i]);
  pos += snprintf(args + pos, size - pos, ",%llx,%llx", *(unsigned long long*)params[31],
                  *(unsigned long long*)params[32]);
  return pos;
}

CUresult cuLaunchKernel(void* f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                        unsigned smem, CUstream stream, void** params, void** extra) {
  FakeFunction* fn = (FakeFunction*)f;
  int err = env_int("FAKE_CUDA_LAUNCH_ERR", 0);
  if (err) return err;
  if (stream && current() != ctx_of_device((int)((uintptr_t)stream & 0xf))) return 201;
  if (!current() || extra) return 201;
  int fwd = strcmp(fn->name, "_ragged_attn_fwd") == 0;
  int linear = strcmp(fn->name, "_ragged_linear") == 0;
  int count = strcmp(fn->name, "_select_count") == 0, scatter = strcmp(fn->name, "_select_scatter") == 0;
  int gelu = strcmp(fn->name, "_bias_gelu") == 0, norm = strcmp(fn->name, "_gather_layer_norm") == 0;
  int embed = strcmp(fn->name, "_patch_embed") == 0, merge = strcmp(fn->name, "_ragged_merge") == 0;
  /* attention: 8 pointers (QKV, Bias, CU, Out/Lse or Lse/ClsAttn, PosTable, TokPos, KeyBias), then int32s; linear: 6
     pointers (X, W, Bias, Res, CU, Y), then 8 int32s; select count: 3 pointers (Scores, CU, K), then 7 int32s;
     select scatter: 7 pointers (Scores, CU, K, Src, CuNew, SeqId, Pos), then 5 int32s; bias gelu: 3 pointers (X,
     Bias, Y), then 3 int32s; gather layer norm: 9 pointers (X, Skip, Bias, Index, Gamma, Beta, CU, N, Sum), then T,
     R, D, B, eps (fp32 bits), has_skip, has_bias, has_live; patch embed: 5 pointers (Img, W, Prefix, Pos, Out), then 10 int32s; merge:
     12 pointers (X, QKV, Bias, Size, Skip, SkipBias, XOut, SizeOut, CuOut, Src, KeyBias, Score), then 11 int32s;
     then Triton's 2 scratch pointers */
  int n_ptr = linear ? 6 : (count || gelu ? 3 : (norm ? 9 : (embed ? 5 : (scatter ? 7 : (merge ? 12 : 8)))));
  int n_int = linear ? 8 : (count ? 7 : (scatter ? 5 : (gelu ? 3 : (norm ? 8 : (embed ? 10 : (fwd || merge ? 11 : 9))))));
  char args[1024];
  int pos = 0;
  if (strcmp(fn->name, "_ragged_linear_tma") == 0) {
    print_tma_linear(args, sizeof args, params);
    log_line("launch %s %s grid=%u,%u,%u block=%u,%u,%u smem=%u stream=%llx ctx=%d args=%s", fn->name, fn->tag, gx,
             gy, gz, bx, by, bz, smem, (unsigned long long)(uintptr_t)stream, device_of_ctx(current()), args);
    return 0;
  }
  for (int i = 0; i < n_ptr; ++i)
    pos += snprintf(args + pos, sizeof args - pos, "%s%llx", i ? "," : "", *(unsigned long long*)params[i]);
  for (int i = 0; i < n_int; ++i) pos += snprintf(args + pos, sizeof args - pos, ",%d", *(int32_t*)params[n_ptr + i]);
  pos += snprintf(args + pos, sizeof args - pos, ",%llx,%llx", *(unsigned long long*)params[n_ptr + n_int],
                  *(unsigned long long*)params[n_ptr + 1 + n_int]);
  log_line("launch %s %s grid=%u,%u,%u block=%u,%u,%u smem=%u stream=%llx ctx=%d args=%s", fn->name, fn->tag, gx, gy,
           gz, bx, by, bz, smem, (unsigned long long)(uintptr_t)stream, device_of_ctx(current()), args);
  return 0;
}
CUresult cuGetErrorName(CUresult r, const char** name) {
  switch (r) {
    case 1: *name = "CUDA_ERROR_INVALID_VALUE"; return 0;
    case 200: *name = "CUDA_ERROR_INVALID_IMAGE"; return 0;
    case 201: *name = "CUDA_ERROR_INVALID_CONTEXT"; return 0;
    case 209: *name = "CUDA_ERROR_NO_BINARY_FOR_GPU"; return 0;
    case 700: *name = "CUDA_ERROR_ILLEGAL_ADDRESS"; return 0;
    default: return 1;
  }
}

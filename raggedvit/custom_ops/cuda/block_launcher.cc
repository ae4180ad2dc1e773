// Launcher of the AOT-compiled block engine (raggedvit/kernels/_block_kernel.py:_vit_block): the image of the
// device's arch (same major, highest minor <= the device's) for the stream type, cls_attn and LayerScale, with the
// smallest BLOCK_C >= C; the scratch carved out of one workspace (the layout of block_engine.block_workspace);
// then a memset of the counters and one cooperative launch of (resident programs per SM) x SMs programs, so the
// kernel's grid barriers can never wait on a program that is not running. The live count cu[B] is read by the
// kernel, never on the host.
#include <algorithm>
#include <cstdint>
#include <string>

#include "launch_context.h"
#include "launcher.h"

namespace raggedvit::cuda {

namespace {

constexpr int64_t kInt32Limit = int64_t{1} << 31;  // the kernel's sizes and offsets within a row block are int32
constexpr size_t kAlign = 256;

long PickBlockImage(const BlockLaunch& b, int arch) {
  long best = -1;
  const bool cls = b.cls_attn != nullptr, ls = b.w[kWLs1] != nullptr;
  for (size_t i = 0; i < kNumBlockImages; ++i) {
    const BlockImage& im = kBlockImages[i];
    if (im.stream_dtype != b.stream_dtype || im.cls_attn != cls || im.layer_scale != ls || im.block_c < b.C) continue;
    if (im.arch / 10 != arch / 10 || im.arch > arch) continue;
    if (best < 0) {
      best = static_cast<long>(i);
      continue;
    }
    const BlockImage& o = kBlockImages[best];
    if (im.block_c < o.block_c || (im.block_c == o.block_c && im.arch > o.arch)) best = static_cast<long>(i);
  }
  return best;
}

int WidestBlockC() {
  int widest = 0;
  for (size_t i = 0; i < kNumBlockImages; ++i) widest = kBlockImages[i].block_c > widest ? kBlockImages[i].block_c : widest;
  return widest;
}

std::string Sizes(const BlockLaunch& b) {
  return "T = " + std::to_string(b.T) + ", C = " + std::to_string(b.C) + ", F = " + std::to_string(b.F) +
         ", B = " + std::to_string(b.B) + ", num_heads = " + std::to_string(b.H);
}

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The scratch of one launch, in block_engine.block_workspace's order: byte offsets into the workspace.
struct Layout {
  size_t xn = 0, qkv = 0, att = 0, hid = 0, x1 = 0, lse = 0, cls = 0, part = 0, ctr = 0, end = 0;
  int64_t max_tiles = 0, counters = 0;
};

// Appends `count` elements of `elem` bytes at the next kAlign boundary; false on overflow.
bool Append(size_t* cursor, int64_t count, int64_t elem, size_t* offset) {
  int64_t bytes = 0;
  if (count < 0 || __builtin_mul_overflow(count, elem, &bytes)) return false;
  size_t start = (*cursor + kAlign - 1) / kAlign * kAlign;
  if (start < *cursor || __builtin_add_overflow(start, static_cast<size_t>(bytes), cursor)) return false;
  *offset = start;
  return true;
}

bool MakeLayout(const BlockLaunch& b, Layout* l) {
  const int64_t T = b.T, C = b.C, F = b.F, H = b.H;
  const int64_t s = b.stream_dtype == DType::kFloat32 ? 4 : 2;
  const bool cls = b.cls_attn != nullptr;
  const BlockConfig& k = kBlockConfig;
  l->max_tiles = CeilDiv(T, k.bm) * CeilDiv(C, k.bn_narrow);
  if (l->max_tiles < 1) l->max_tiles = 1;
  l->counters = 2 * l->max_tiles + 2;  // split-K tile counters, the grid barrier's and the exit counter
  int64_t tc = 0, t3c = 0, tf = 0, ht = 0, stc = 0;
  if (__builtin_mul_overflow(T, C, &tc) || __builtin_mul_overflow(tc, 3, &t3c) || __builtin_mul_overflow(T, F, &tf) ||
      __builtin_mul_overflow(H, T, &ht) || __builtin_mul_overflow(tc, static_cast<int64_t>(k.max_split), &stc)) {
    return false;
  }
  size_t c = 0;
  return Append(&c, tc, 2, &l->xn) && Append(&c, t3c, 2, &l->qkv) && Append(&c, tc, 2, &l->att) &&
         Append(&c, tf, 2, &l->hid) && Append(&c, tc, s, &l->x1) && Append(&c, cls ? ht : 1, 4, &l->lse) &&
         Append(&c, 1, 4, &l->cls) && Append(&c, k.max_split > 1 ? stc : C, 4, &l->part) &&
         Append(&c, l->counters, 4, &l->ctr) && ((l->end = c), true);
}

}  // namespace

std::string CheckBlockSupported(const BlockLaunch& b) {
  if (b.T < 0 || b.C < 1 || b.F < 1 || b.B < 0 || b.H < 1) return "sizes out of range: " + Sizes(b);
  if (b.gemm_dtype != DType::kFloat16) {
    return std::string("Linear weights of type ") + DTypeName(b.gemm_dtype) +
           " have no CUDA block engine (float16 does)";
  }
  if (b.stream_dtype != DType::kFloat16 && b.stream_dtype != DType::kFloat32) {
    return std::string("x of type ") + DTypeName(b.stream_dtype) + " has no CUDA block engine (float, float16 do)";
  }
  if (b.index_type != IndexType::kInt64) return "cu_seqlens must be int64 on the CUDA EP (the AOT cubins assume it)";
  const char* bias_names[] = {"qkv_bias", "proj_bias", "fc1_bias", "fc2_bias"};
  const int biases[] = {kWQkvB, kWProjB, kWFc1B, kWFc2B};
  for (int i = 0; i < 4; ++i) {
    if (b.w[biases[i]] == nullptr) {
      return std::string("input '") + bias_names[i] + "' is absent: the CUDA block engine needs all four Linear biases";
    }
  }
  if ((b.w[kWLs1] == nullptr) != (b.w[kWLs2] == nullptr)) {
    return "inputs 'ls1' and 'ls2' must be both present or both absent on the CUDA EP";
  }
  if (b.C % b.H != 0) return "num_heads must divide C: " + Sizes(b);
  const int64_t D = b.C / b.H;
  if (b.C % 16 != 0 || b.F % 16 != 0 || D % 16 != 0) {
    return "C, F and the head dim C / num_heads must be multiples of 16 on the CUDA EP: " + Sizes(b);
  }
  if (D > kBlockConfig.head_dim_max) {
    return "head dim " + std::to_string(D) + " exceeds the block engine's " + std::to_string(kBlockConfig.head_dim_max) +
           ": " + Sizes(b);
  }
  const int widest = WidestBlockC();
  if (b.C > widest) {
    return "C = " + std::to_string(b.C) + " exceeds the widest block engine cubin of this library (" +
           std::to_string(widest) + ")";
  }
  const int64_t wide = b.F > 3 * b.C ? b.F : 3 * b.C;
  int64_t elems = 0;
  if (__builtin_mul_overflow(b.T, wide, &elems) || elems >= kInt32Limit || b.B >= kInt32Limit) {
    return Sizes(b) + ": T * max(3C, F) must be below 2**31";
  }
  const void* ptrs[] = {b.x, b.cu, b.y, b.workspace, b.cls_attn};
  const char* names[] = {"x", "cu_seqlens", "y", "workspace", "cls_attn"};
  for (int i = 0; i < 5; ++i) {
    if (reinterpret_cast<uintptr_t>(ptrs[i]) % 16 != 0) {
      return std::string("device buffer '") + names[i] + "' is not 16-byte aligned";
    }
  }
  for (int i = 0; i < kNumBlockWeights; ++i) {
    if (reinterpret_cast<uintptr_t>(b.w[i]) % 16 != 0) {
      return "weight input " + std::to_string(i + 2) + " of RaggedViTBlock is not 16-byte aligned";
    }
  }
  return "";
}

std::string BlockWorkspaceBytes(const BlockLaunch& b, size_t* bytes) {
  Layout l;
  if (!MakeLayout(b, &l)) return Sizes(b) + ": the block engine's scratch size overflows";
  *bytes = l.end;
  return "";
}

std::string LaunchVitBlock(const BlockLaunch& b) {
  std::string err = CheckBlockSupported(b);
  if (!err.empty()) return err;
  Layout l;
  if (!MakeLayout(b, &l)) return Sizes(b) + ": the block engine's scratch size overflows";
  if (b.workspace == nullptr) return "the block engine needs a workspace";
  err = DriverError();
  if (!err.empty()) return err;
  CUfunction fn = nullptr;
  long index = -1;
  int sms = 0, per_sm = 0;
  LaunchScope scope;
  err = EnterContext(b.stream, b.device_ordinal, scope, [&](int arch, const LoadFn& load) -> std::string {
    index = PickBlockImage(b, arch);
    if (index < 0) {
      return std::string("no RaggedViTBlock cubin for sm_") + std::to_string(arch) + " with x " +
             DTypeName(b.stream_dtype) + (b.cls_attn ? ", cls_attn" : "") + (b.w[kWLs1] ? ", LayerScale" : "") +
             " and C = " + std::to_string(b.C) + " in this library (rebuild with build.py --archs)";
    }
    const BlockImage& im = kBlockImages[index];
    std::string e = load(CubinRef{im.cubin, im.function_name, im.shared_bytes}, &fn);
    if (e.empty()) e = CurrentMultiprocessorCount(&sms);
    if (e.empty()) e = ResidentPrograms(fn, im.num_warps, im.shared_bytes, &per_sm);
    return e;
  });
  if (!err.empty()) return err;
  const BlockImage& im = kBlockImages[index];
  if (per_sm < 1) return std::string(im.function_name) + ": not one program fits a multiprocessor";
  if (per_sm > kBlockConfig.programs_per_sm) per_sm = kBlockConfig.programs_per_sm;
  char* ws = static_cast<char*>(b.workspace);
  auto ptr = [](const void* p) { return reinterpret_cast<CUdeviceptr>(p); };
  CUdeviceptr x = ptr(b.x), cu = ptr(b.cu), y = ptr(b.y);
  CUdeviceptr w[kNumBlockWeights];
  for (int i = 0; i < kNumBlockWeights; ++i) w[i] = ptr(b.w[i]);
  if (b.w[kWLs1] == nullptr) w[kWLs1] = w[kWNorm1W];  // never read without LayerScale (HAS_LS1 = 0)
  if (b.w[kWLs2] == nullptr) w[kWLs2] = w[kWNorm2W];
  CUdeviceptr xn = ptr(ws + l.xn), qkv = ptr(ws + l.qkv), att = ptr(ws + l.att), hid = ptr(ws + l.hid);
  CUdeviceptr x1 = ptr(ws + l.x1), lse = ptr(ws + l.lse), part = ptr(ws + l.part), ctr = ptr(ws + l.ctr);
  CUdeviceptr cls = b.cls_attn != nullptr ? ptr(b.cls_attn) : ptr(ws + l.cls);
  CUdeviceptr scratch = 0, profile_scratch = 0;
  const int64_t per_seq = CeilDiv(b.T, b.B > 0 ? b.B : 1);
  const int64_t J = std::max<int64_t>(1, CeilDiv(per_seq, kBlockConfig.att_bm));  // query-tile groups
  int32_t T = static_cast<int32_t>(b.T), B = static_cast<int32_t>(b.B), Jv = static_cast<int32_t>(J);
  int32_t C = static_cast<int32_t>(b.C), F = static_cast<int32_t>(b.F), H = static_cast<int32_t>(b.H);
  int32_t D = static_cast<int32_t>(b.C / b.H), ph_lo = 0, ph_hi = 7, max_tiles = static_cast<int32_t>(l.max_tiles);
  float eps = b.epsilon, qk_scale = static_cast<float>(static_cast<double>(b.scale) * 1.4426950408889634);
  // X, CU, the 14 weights (BlockWeight order), Xn, Qkv, Att, Lse, Cls, X1, Hid, Part, Ctr, Y, T, B, J, C, F, H, D,
  // eps, qk_scale, ph_lo, ph_hi, max_tiles, global / profile scratch
  void* args[] = {&x,      &cu,      &w[kWNorm1W], &w[kWNorm1B], &w[kWQkv],    &w[kWQkvB], &w[kWProj], &w[kWProjB],
                  &w[kWLs1], &w[kWNorm2W], &w[kWNorm2B], &w[kWFc1], &w[kWFc1B], &w[kWFc2],   &w[kWFc2B], &w[kWLs2],
                  &xn,     &qkv,     &att,         &lse,         &cls,         &x1,        &hid,       &part,
                  &ctr,    &y,       &T,           &B,           &Jv,          &C,         &F,         &H,
                  &D,      &eps,     &qk_scale,    &ph_lo,       &ph_hi,       &max_tiles, &scratch,   &profile_scratch};
  constexpr int kParams = static_cast<int>(sizeof(args) / sizeof(void*));
  if (im.num_params != kParams) {
    return std::string(im.function_name) + ": cubin expects " + std::to_string(im.num_params) +
           " parameters, launcher passes " + std::to_string(kParams);
  }
  err = ZeroWords(ws + l.ctr, static_cast<size_t>(l.counters), b.stream);
  if (!err.empty()) return err;
  if (b.T == 0) return "";  // nothing to compute (the counters are zero all the same)
  return LaunchCooperative(fn, static_cast<unsigned>(per_sm * sms), im.num_warps, im.shared_bytes, b.stream, args,
                           "_vit_block");
}

}  // namespace raggedvit::cuda

// Drives cuda/launcher.cc (and the other launchers) against fake_libcuda.c with a small hand-written kernel table.
// stdin: one scenario per line: dtype(0 fp32,1 fp16,2 bf16) index(0 i32,1 i64) T B H D cls stream_dev
//        device_ordinal misalign scale [pos grid_h grid_w num_prefix [key_bias]]   (stream_dev -1 = null stream;
//        pos 1: pos_table 0xf00000 and token_pos 0xf80000; key_bias 1: key_bias 0x1100000, 2: misaligned)
//        or a RaggedLinear launch: L dtype index T N K B bias residual cu activation misalign
//        or a BiasGelu launch: G dtype M N bias misalign
//        or a GatherLayerNorm launch: N dtype index T R D B skip bias cu misalign   (misalign i > 0: the i-th
//        buffer of X, Skip, Bias, Index, Gamma, Beta, CuSeqlens, Normed, Sum 8 bytes off)
//        or a RaggedSelect launch: S T B width bound num_prefix policy keep mass misalign   (misalign i > 0: the
//        i-th buffer of scores, cu, k, src, cu_new, seq_id, pos 8 bytes off)
//        or a PatchEmbed launch: E dtype B C H W patch P N misalign   (misalign i > 0: the i-th buffer of Images,
//        Weight, Prefix, Pos, Out 8 bytes off)
//        or a RaggedMerge launch: M dtype T B C H Dh num_prefix r class_token bias size skip skip_bias misalign
//        (misalign i > 0: the i-th buffer of x, qkv, qkv_bias, size, skip, skip_bias, x_out, size_out, cu_out, src,
//        key_bias, score 8 bytes off)
// stdout: "OK" or "ERR <message>" per line.
#include <cstdint>
#include <iostream>
#include <sstream>
#include <string>

#include "launcher.h"

namespace raggedvit::cuda {
namespace {
#define IMGPK(kind, dt, it, bd, pos, kb, arch, min_t, name, shared, bm, bn, np)                                     \
  {KernelKind::kind, DType::dt, IndexType::it, bd, pos, kb, arch, min_t, name,                                       \
   reinterpret_cast<const unsigned char*>(#kind "/" #dt "/" #it "/d" #bd "/pos" #pos "/kb" #kb "/sm" #arch "/min"    \
                                          #min_t),                                                                   \
   8, shared, 4, bm, bn, np}
#define IMGP(kind, dt, it, bd, pos, arch, min_t, name, shared, bm, bn, np) \
  IMGPK(kind, dt, it, bd, pos, false, arch, min_t, name, shared, bm, bn, np)
#define IMG(kind, dt, it, bd, arch, min_t, name, shared, bm, bn, np) \
  IMGP(kind, dt, it, bd, false, arch, min_t, name, shared, bm, bn, np)
}  // namespace

const KernelImage kKernelImages[] = {
    IMG(kForward, kFloat16, kInt32, 64, 80, 0, "_ragged_attn_fwd", 16384, 32, 64, 21),
    IMG(kForward, kFloat16, kInt32, 64, 80, 2048, "_ragged_attn_fwd", 32768, 64, 64, 21),
    IMG(kForward, kFloat16, kInt32, 64, 86, 0, "_ragged_attn_fwd", 16384, 32, 64, 21),
    IMG(kForward, kFloat16, kInt32, 64, 90, 0, "_ragged_attn_fwd", 16384, 32, 64, 21),
    IMG(kForward, kFloat16, kInt32, 64, 90, 2048, "_ragged_attn_fwd", 60000, 64, 64, 21),
    IMG(kClsAttn, kFloat16, kInt32, 64, 80, 0, "_ragged_cls_attn", 1024, 0, 128, 19),
    IMG(kClsAttn, kFloat16, kInt32, 64, 86, 0, "_ragged_cls_attn", 1024, 0, 128, 19),
    IMG(kClsAttn, kFloat16, kInt32, 64, 90, 0, "_ragged_cls_attn", 1024, 0, 128, 19),
    IMG(kForward, kFloat32, kInt64, 128, 90, 0, "_ragged_attn_fwd", 53248, 32, 32, 21),
    IMG(kClsAttn, kFloat32, kInt64, 128, 90, 0, "_ragged_cls_attn", 1024, 0, 64, 19),
    IMG(kForward, kBFloat16, kInt32, 32, 90, 0, "_ragged_attn_fwd", 8192, 64, 64, 14),  // wrong param count
    IMG(kClsAttn, kBFloat16, kInt32, 32, 90, 0, "_ragged_cls_attn", 1024, 0, 128, 19),
    // relative position bias variants (fp16/int32/d64 on sm_90 only)
    IMGP(kForward, kFloat16, kInt32, 64, true, 90, 0, "_ragged_attn_fwd", 20480, 32, 64, 21),
    IMGP(kClsAttn, kFloat16, kInt32, 64, true, 90, 0, "_ragged_cls_attn", 2048, 0, 128, 19),
    // key bias variants (fp16/int32/d64 on sm_90 only)
    IMGPK(kForward, kFloat16, kInt32, 64, false, true, 90, 0, "_ragged_attn_fwd", 16896, 32, 64, 21),
    IMGPK(kClsAttn, kFloat16, kInt32, 64, false, true, 90, 0, "_ragged_cls_attn", 1024, 0, 128, 19),
};
const size_t kNumKernelImages = sizeof(kKernelImages) / sizeof(kKernelImages[0]);

namespace {
#define LIN(dt, it, arch, config, shared, bm, bn, np)                                                             \
  {DType::dt, IndexType::it, arch, LinearConfig::config, "_ragged_linear",                                         \
   reinterpret_cast<const unsigned char*>("linear/" #dt "/" #it "/sm" #arch "/" #config), 8, shared, 4, bm, bn, np, \
   64, false, 1}
#define LIN_TMA(dt, it, arch, shared, bm, bn, np)                                                                  \
  {DType::dt, IndexType::it, arch, LinearConfig::kTma, "_ragged_linear_tma",                                      \
   reinterpret_cast<const unsigned char*>("linear/" #dt "/" #it "/sm" #arch "/kTma"), 8, shared, 4, bm, bn, np, 64, \
   true, 2}
}  // namespace

// sm_90: every config but kXLarge, kTma for fp16/int32 and bf16/int32 (the latter with a wrong parameter count);
// sm_80: kLarge skipped by the build (shared memory), so it falls back to kSmallWide
const LinearImage kLinearImages[] = {
    LIN_TMA(kFloat16, kInt32, 90, 106536, 64, 128, 33),
    LIN_TMA(kBFloat16, kInt32, 90, 106536, 64, 128, 32),  // wrong param count
    LIN(kFloat16, kInt32, 90, kSmallNarrow, 49152, 64, 32, 16),
    LIN(kFloat16, kInt32, 90, kSmallWide, 65536, 64, 64, 16),
    LIN(kFloat16, kInt32, 90, kLarge, 98304, 128, 128, 16),
    LIN(kFloat16, kInt32, 80, kSmallNarrow, 36864, 64, 32, 16),
    LIN(kFloat16, kInt32, 80, kSmallWide, 49152, 64, 64, 16),
    LIN(kBFloat16, kInt64, 90, kSmallNarrow, 49152, 64, 32, 15),  // wrong param count
};
const size_t kNumLinearImages = sizeof(kLinearImages) / sizeof(kLinearImages[0]);
const int64_t kLinearLargeT = 1024;
const int64_t kLinearNarrowN = 1024;
const int64_t kLinearCapacityNarrowN = 1536;
const int kLinearTmaMinArch = 90;

namespace {
#define SEL(kernel, arch, wp, name, shared, warps, np)                                                           \
  {SelectKernel::kernel, arch, name, reinterpret_cast<const unsigned char*>("select/" #kernel "/sm" #arch "/w" #wp), \
   8, shared, warps, wp, np}
}  // namespace

// sm_90: sort widths 1024 (listed first), 256 and 512 with different num_warps (the launch must take the picked
// image's); sm_80 one width; sm_75 and sm_100 carry wrong parameter counts (so sm_70 has no image: same major,
// but only a higher minor)
const SelectImage kSelectImages[] = {
    SEL(kCount, 90, 1024, "_select_count", 0, 16, 12),
    SEL(kScatter, 90, 1024, "_select_scatter", 2048, 16, 14),
    SEL(kCount, 90, 256, "_select_count", 0, 8, 12),
    SEL(kScatter, 90, 256, "_select_scatter", 1024, 8, 14),
    SEL(kCount, 90, 512, "_select_count", 0, 2, 12),
    SEL(kScatter, 90, 512, "_select_scatter", 512, 2, 14),
    SEL(kCount, 80, 256, "_select_count", 0, 4, 12),
    SEL(kScatter, 80, 256, "_select_scatter", 512, 4, 14),
    SEL(kCount, 75, 256, "_select_count", 0, 8, 11),  // wrong param count on the first kernel
    SEL(kScatter, 75, 256, "_select_scatter", 0, 8, 14),
    SEL(kCount, 100, 256, "_select_count", 0, 8, 12),
    SEL(kScatter, 100, 256, "_select_scatter", 0, 8, 13),  // wrong param count on the second kernel
};
const size_t kNumSelectImages = sizeof(kSelectImages) / sizeof(kSelectImages[0]);

namespace {
#define GELU(dt, arch, config, bm, bn, warps, np)                                                                  \
  {DType::dt, arch, GeluConfig::config, "_bias_gelu",                                                             \
   reinterpret_cast<const unsigned char*>("gelu/" #dt "/sm" #arch "/" #config), 8, 0, warps, bm, bn, np}
}  // namespace

// sm_90 and sm_80 both configs (sm_80 listed first: the launch must take the device's arch), bf16 on sm_90 with a
// wrong parameter count
const GeluImage kGeluImages[] = {
    GELU(kFloat16, 80, kSmall, 1, 1024, 4, 8),
    GELU(kFloat16, 80, kLarge, 8, 512, 4, 8),
    GELU(kFloat16, 90, kSmall, 1, 1024, 4, 8),
    GELU(kFloat16, 90, kLarge, 8, 512, 4, 8),
    GELU(kBFloat16, 90, kSmall, 1, 1024, 4, 7),
};
const size_t kNumGeluImages = sizeof(kGeluImages) / sizeof(kGeluImages[0]);
const int64_t kGeluLargeM = 1024;

namespace {
#define NORM(dt, it, arch, br, bd, warps, np)                                                                     \
  {DType::dt, IndexType::it, arch, br, bd, "_gather_layer_norm",                                                \
   reinterpret_cast<const unsigned char*>("norm/" #dt "/" #it "/sm" #arch "/d" #bd), 8, 0, warps, np}
}  // namespace

// sm_90 int32: BLOCK_D 1024 listed before 256 and 512 (the launch must take the smallest >= D); sm_90 int64: 256 and
// 1024 only (D = 512 takes the int64 d1024, never an int32 image); sm_80 only int32 256 (wider rows and int64 find
// no sm_80 image), bf16 on sm_90 with a wrong parameter count
const NormImage kNormImages[] = {
    NORM(kFloat16, kInt32, 90, 2, 1024, 4, 19),
    NORM(kFloat16, kInt32, 90, 8, 256, 4, 19),
    NORM(kFloat16, kInt32, 90, 4, 512, 4, 19),
    NORM(kFloat16, kInt64, 90, 8, 256, 4, 19),
    NORM(kFloat16, kInt64, 90, 2, 1024, 4, 19),
    NORM(kFloat16, kInt32, 80, 8, 256, 4, 19),
    NORM(kBFloat16, kInt32, 90, 8, 256, 4, 18),
};
const size_t kNumNormImages = sizeof(kNormImages) / sizeof(kNormImages[0]);

namespace {
#define EMB(dt, arch, config, al, shared, bm, bn, warps, np)                                                      \
  {DType::dt, arch, EmbedConfig::config, al, "_patch_embed",                                                      \
   reinterpret_cast<const unsigned char*>("embed/" #dt "/sm" #arch "/" #config "/aligned" #al), 8, shared, warps, \
   bm, bn, np}
}  // namespace

// fp32 aligned: sm_80 listed first (the launch must take the device's arch), sm_86 without kLarge (skipped by the
// build: shared memory), sm_90 every config; fp32 unaligned on sm_90 without kLarge; fp16 aligned: sm_90 every
// config, sm_80 without kLarge (no fp16 image of a higher minor has it either); fp16 unaligned: sm_90 kSmall only,
// with a wrong parameter count
const EmbedImage kEmbedImages[] = {
    EMB(kFloat32, 80, kSmall, true, 20480, 32, 64, 4, 17),
    EMB(kFloat32, 80, kMid, true, 49152, 64, 128, 4, 17),
    EMB(kFloat32, 80, kLarge, true, 98304, 128, 128, 8, 17),
    EMB(kFloat32, 86, kSmall, true, 20480, 32, 64, 4, 17),
    EMB(kFloat32, 86, kMid, true, 49152, 64, 128, 4, 17),
    EMB(kFloat32, 90, kSmall, true, 20480, 32, 64, 4, 17),
    EMB(kFloat32, 90, kMid, true, 65536, 64, 128, 4, 17),
    EMB(kFloat32, 90, kLarge, true, 114688, 128, 128, 8, 17),
    EMB(kFloat32, 90, kSmall, false, 24576, 32, 64, 4, 17),
    EMB(kFloat32, 90, kMid, false, 65536, 64, 128, 4, 17),
    EMB(kFloat16, 90, kSmall, true, 20480, 32, 64, 4, 17),
    EMB(kFloat16, 90, kMid, true, 40960, 64, 128, 4, 17),
    EMB(kFloat16, 90, kLarge, true, 98304, 128, 128, 8, 17),
    EMB(kFloat16, 80, kSmall, true, 20480, 32, 64, 4, 17),
    EMB(kFloat16, 80, kMid, true, 40960, 64, 128, 4, 17),
    EMB(kFloat16, 90, kSmall, false, 20480, 32, 64, 4, 16),  // wrong param count
};
const size_t kNumEmbedImages = sizeof(kEmbedImages) / sizeof(kEmbedImages[0]);
const int64_t kEmbedMidM = 512;

const int64_t kEmbedLargeM = 16384;

namespace {
#define MRG(dt, arch, w, bd, warps, shared, np)                                                                   \
  {DType::dt, arch, w, bd, "_ragged_merge",                                                                       \
   reinterpret_cast<const unsigned char*>("merge/" #dt "/sm" #arch "/w" #w "/d" #bd), 8, shared, warps, np}
}  // namespace

// fp16 on sm_90: widths 2048 (listed first), 128 and 512, d64 each and d128 at width 128 (the launch must take the
// smallest width >= n_A, then the smallest block_d >= Dh); fp16 on sm_80: width 128 / d64 only, with other warps;
// fp32 on sm_90 with a wrong parameter count; no bf16 image
const MergeImage kMergeImages[] = {
    MRG(kFloat16, 90, 2048, 64, 16, 24576, 25),
    MRG(kFloat16, 90, 128, 128, 8, 49152, 25),
    MRG(kFloat16, 90, 128, 64, 8, 24576, 25),
    MRG(kFloat16, 90, 512, 64, 8, 24576, 25),
    MRG(kFloat16, 80, 128, 64, 4, 24576, 25),
    MRG(kFloat32, 90, 128, 64, 8, 24576, 24),
};
const size_t kNumMergeImages = sizeof(kMergeImages) / sizeof(kMergeImages[0]);
const char* const kBuildInfoJson = "{}";
}  // namespace raggedvit::cuda

int main() {
  using namespace raggedvit::cuda;
  std::string line;
  while (std::getline(std::cin, line)) {
    if (line.empty()) continue;
    std::istringstream in(line);
    if (line[0] == 'L') {
      std::string tag;
      int dtype, index, bias, residual, cu, misalign;
      LinearLaunch l;
      in >> tag >> dtype >> index >> l.T >> l.N >> l.K >> l.B >> bias >> residual >> cu >> l.activation >> misalign;
      l.dtype = static_cast<DType>(dtype);
      l.index_type = static_cast<IndexType>(index);
      l.x = reinterpret_cast<const void*>(uintptr_t{0xa00000} + misalign);
      l.w = reinterpret_cast<const void*>(uintptr_t{0xa80000});
      if (bias) l.bias = reinterpret_cast<const void*>(uintptr_t{0xb80000});
      if (residual) l.residual = reinterpret_cast<const void*>(uintptr_t{0xc80000});
      if (cu) l.cu = reinterpret_cast<const void*>(uintptr_t{0xb00000});
      l.y = reinterpret_cast<void*>(uintptr_t{0xc00000});
      l.stream = reinterpret_cast<void*>(uintptr_t{0x5000});
      std::string err = LaunchRaggedLinear(l);
      std::cout << (err.empty() ? "OK" : "ERR " + err) << std::endl;
      continue;
    }
    if (line[0] == 'G') {
      std::string tag;
      int dtype, bias, misalign;
      GeluLaunch g;
      in >> tag >> dtype >> g.M >> g.N >> bias >> misalign;
      g.dtype = static_cast<DType>(dtype);
      g.x = reinterpret_cast<const void*>(uintptr_t{0xa00000} + misalign);
      if (bias) g.bias = reinterpret_cast<const void*>(uintptr_t{0xb00000});
      g.y = reinterpret_cast<void*>(uintptr_t{0xc00000});
      g.stream = reinterpret_cast<void*>(uintptr_t{0x5000});
      std::string err = LaunchBiasGelu(g);
      std::cout << (err.empty() ? "OK" : "ERR " + err) << std::endl;
      continue;
    }
    if (line[0] == 'N') {
      std::string tag;
      int dtype, index, skip, bias, cu, misalign;
      NormLaunch n;
      in >> tag >> dtype >> index >> n.T >> n.R >> n.D >> n.B >> skip >> bias >> cu >> misalign;
      n.dtype = static_cast<DType>(dtype);
      n.index_type = static_cast<IndexType>(index);
      uintptr_t addr[9] = {0xa00000, 0xa80000, 0xb00000, 0xb40000, 0xb80000, 0xbc0000, 0xbe0000, 0xc00000, 0xc80000};
      if (misalign > 0 && misalign <= 9) addr[misalign - 1] += 8;
      n.x = reinterpret_cast<const void*>(addr[0]);
      if (skip) n.skip = reinterpret_cast<const void*>(addr[1]);
      if (bias) n.bias = reinterpret_cast<const void*>(addr[2]);
      n.index = reinterpret_cast<const void*>(addr[3]);
      n.gamma = reinterpret_cast<const void*>(addr[4]);
      n.beta = reinterpret_cast<const void*>(addr[5]);
      if (cu) n.cu = reinterpret_cast<const void*>(addr[6]);
      n.normed = reinterpret_cast<void*>(addr[7]);
      n.sum = reinterpret_cast<void*>(addr[8]);
      n.epsilon = 1e-6f;
      n.stream = reinterpret_cast<void*>(uintptr_t{0x5000});
      std::string err = LaunchGatherLayerNorm(n);
      std::cout << (err.empty() ? "OK" : "ERR " + err) << std::endl;
      continue;
    }
    if (line[0] == 'E') {
      std::string tag;
      int dtype, misalign;
      EmbedLaunch e;
      in >> tag >> dtype >> e.B >> e.C >> e.H >> e.W >> e.patch >> e.P >> e.N >> misalign;
      e.dtype = static_cast<DType>(dtype);
      uintptr_t addr[5] = {0xa00000, 0xa80000, 0xb00000, 0xb80000, 0xc00000};
      if (misalign > 0 && misalign <= 5) addr[misalign - 1] += 8;
      e.images = reinterpret_cast<const void*>(addr[0]);
      e.weight = reinterpret_cast<const void*>(addr[1]);
      e.prefix = reinterpret_cast<const void*>(addr[2]);
      e.pos = reinterpret_cast<const void*>(addr[3]);
      e.out = reinterpret_cast<void*>(addr[4]);
      e.stream = reinterpret_cast<void*>(uintptr_t{0x5000});
      std::string err = LaunchPatchEmbed(e);
      std::cout << (err.empty() ? "OK" : "ERR " + err) << std::endl;
      continue;
    }
    if (line[0] == 'M') {
      std::string tag;
      int dtype, class_token, bias, size, skip, skip_bias, misalign;
      MergeLaunch m;
      in >> tag >> dtype >> m.T >> m.B >> m.C >> m.H >> m.Dh >> m.num_prefix >> m.r >> class_token >> bias >> size >>
          skip >> skip_bias >> misalign;
      m.dtype = static_cast<DType>(dtype);
      m.class_token = class_token != 0;
      uintptr_t addr[12] = {0xa00000, 0xa80000, 0xb00000, 0xb40000, 0xb80000, 0xbc0000,
                            0xc00000, 0xc80000, 0xcc0000, 0xd00000, 0xd80000, 0xe00000};
      if (misalign > 0 && misalign <= 12) addr[misalign - 1] += 8;
      m.x = reinterpret_cast<const void*>(addr[0]);
      m.qkv = reinterpret_cast<const void*>(addr[1]);
      if (bias) m.qkv_bias = reinterpret_cast<const void*>(addr[2]);
      if (size) m.size = reinterpret_cast<const void*>(addr[3]);
      if (skip) m.skip = reinterpret_cast<const void*>(addr[4]);
      if (skip_bias) m.skip_bias = reinterpret_cast<const void*>(addr[5]);
      m.x_out = reinterpret_cast<void*>(addr[6]);
      m.size_out = reinterpret_cast<void*>(addr[7]);
      m.cu_out = reinterpret_cast<void*>(addr[8]);
      m.src = reinterpret_cast<void*>(addr[9]);
      m.key_bias = reinterpret_cast<void*>(addr[10]);
      m.score = reinterpret_cast<void*>(addr[11]);
      m.stream = reinterpret_cast<void*>(uintptr_t{0x5000});
      std::string err = LaunchRaggedMerge(m);
      std::cout << (err.empty() ? "OK" : "ERR " + err) << std::endl;
      continue;
    }
    if (line[0] == 'S') {
      std::string tag;
      int misalign;
      SelectLaunch s;
      in >> tag >> s.T >> s.B >> s.width >> s.bound >> s.num_prefix >> s.policy >> s.keep >> s.mass >> misalign;
      uintptr_t addr[7] = {0xa00000, 0xb00000, 0xb40000, 0xc00000, 0xc40000, 0xc80000, 0xcc0000};
      if (misalign > 0 && misalign <= 7) addr[misalign - 1] += 8;
      s.scores = reinterpret_cast<const void*>(addr[0]);
      s.cu = reinterpret_cast<const void*>(addr[1]);
      s.k = reinterpret_cast<void*>(addr[2]);
      s.src = reinterpret_cast<void*>(addr[3]);
      s.cu_new = reinterpret_cast<void*>(addr[4]);
      s.seq_id = reinterpret_cast<void*>(addr[5]);
      s.pos = reinterpret_cast<void*>(addr[6]);
      s.stream = reinterpret_cast<void*>(uintptr_t{0x5000});
      std::string err = LaunchRaggedSelect(s);
      std::cout << (err.empty() ? "OK" : "ERR " + err) << std::endl;
      continue;
    }
    int dtype, index, cls, stream_dev, misalign;
    AttentionLaunch a;
    in >> dtype >> index >> a.T >> a.B >> a.H >> a.D >> cls >> stream_dev >> a.device_ordinal >> misalign >> a.scale;
    a.dtype = static_cast<DType>(dtype);
    a.index_type = static_cast<IndexType>(index);
    a.qkv = reinterpret_cast<const void*>(uintptr_t{0xa00000} + misalign);
    a.cu = reinterpret_cast<const void*>(uintptr_t{0xb00000});
    a.out = reinterpret_cast<void*>(uintptr_t{0xc00000});
    if (cls) {
      a.lse = reinterpret_cast<void*>(uintptr_t{0xd00000});
      a.cls_attn = reinterpret_cast<void*>(uintptr_t{0xe00000});
    }
    a.stream = stream_dev < 0 ? nullptr : reinterpret_cast<void*>(uintptr_t{0x5000} + stream_dev);
    int pos = 0, key_bias = 0;
    if (in >> pos >> a.grid_h >> a.grid_w >> a.num_prefix && pos) {
      a.pos_table = reinterpret_cast<const void*>(uintptr_t{0xf00000});
      a.token_pos = reinterpret_cast<const void*>(uintptr_t{0xf80000} + (pos == 2 ? 4 : 0));  // 2: misaligned
    }
    if (in >> key_bias && key_bias) {
      a.key_bias = reinterpret_cast<const void*>(uintptr_t{0x1100000} + (key_bias == 2 ? 4 : 0));  // 2: misaligned
    }
    std::string err = LaunchRaggedAttention(a);
    std::cout << (err.empty() ? "OK" : "ERR " + err) << std::endl;
  }
  return 0;
}

// CPU kernel: per image a stable descending sort of the patch scores (ties: lower position first), k by the
// policy, then the capacity compaction of select.capacity_order (kept slots first, the other slots in slot order).
//
// Same values as the torch op on finite scores: the count policy is exact (one float32 product, ceil); for the
// cls mass the normalising sum is accumulated in double and rounded once (torch's CPU sum uses a vectorised
// float cascade, so the sum may differ in its last bit), the cumsum in double with each prefix rounded to float
// (what torch's CPU cumsum does), and exclusive = cumsum - a in float. Scores are ordered as float32 with -0 = +0;
// NaN / -inf patch scores are ranked by their bits (a total order: the kept rows stay a permutation of the slots).
#include "ragged_select_cpu.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

namespace raggedvit {

namespace {

// Monotone int key of a float32 (larger float -> larger key; -0 and +0 equal; NaN by its bits).
inline int32_t OrderKey(float s) {
  s += 0.0f;  // -0 -> +0
  int32_t bits = 0;
  std::memcpy(&bits, &s, sizeof(bits));
  return bits < 0 ? bits ^ 0x7fffffff : bits;
}

// k of one image (DESIGN.md section 4 step 3) from its patch scores in descending order.
int64_t KeptPatches(const std::vector<float>& sorted, int64_t patches, const SelectAttrs& a) {
  int64_t k = 0;
  if (a.policy == 0) {
    k = static_cast<int64_t>(std::ceil(static_cast<float>(patches) * a.keep));
  } else if (patches > 0) {
    double sum = 0.0;
    for (float v : sorted) sum += v;
    const float den = std::max(static_cast<float>(sum), kClsMassEps);
    double cum = 0.0;
    for (float v : sorted) {
      const float av = v / den;
      cum += av;
      if (static_cast<float>(cum) - av < a.mass) ++k;
    }
  }
  return std::min(std::max(k, int64_t{1}), patches);
}

}  // namespace

RaggedSelectCpuKernel::RaggedSelectCpuKernel(const SelectAttrs& attrs, const OrtKernelInfo*) : attrs_(attrs) {}

OrtStatusPtr RaggedSelectCpuKernel::ComputeV2(OrtKernelContext* context) {
  return GuardStatus(
      [&]() -> OrtStatusPtr {
        Ort::KernelContext ctx(context);
        const auto scores_v = ctx.GetInput(kSelectScores), cu_v = ctx.GetInput(kSelectCu);
        const auto s_info = scores_v.GetTensorTypeAndShapeInfo(), c_info = cu_v.GetTensorTypeAndShapeInfo();
        SelectDims d;
        std::string err = CheckSelectInputs(s_info.GetShape(), s_info.GetElementType(), c_info.GetShape(),
                                            c_info.GetElementType(), attrs_, &d);
        if (!err.empty()) return MakeSelectStatus(ORT_INVALID_ARGUMENT, err);
        const int64_t* cu = cu_v.GetTensorData<int64_t>();
        err = CheckSelectCu(cu, d, attrs_);
        if (!err.empty()) return MakeSelectStatus(ORT_INVALID_ARGUMENT, err);
        const float* scores = scores_v.GetTensorData<float>();
        const SelectAttrs& a = attrs_;
        const int64_t B = d.B, W = a.width, p = a.num_prefix;
        int64_t* src = ctx.GetOutput(kSelectSrc, {d.rows}).GetTensorMutableData<int64_t>();
        int64_t* cu_new = ctx.GetOutput(kSelectCuNew, {B + 1}).GetTensorMutableData<int64_t>();
        int64_t* seq_id = ctx.GetOutput(kSelectSeqId, {d.rows}).GetTensorMutableData<int64_t>();
        int64_t* pos = ctx.GetOutput(kSelectPos, {d.rows}).GetTensorMutableData<int64_t>();
        int64_t* k_out = ctx.GetOutput(kSelectK, {B}).GetTensorMutableData<int64_t>();

        // pass 1: each image's kept slots (keep[b*W + j]) and count; cu_new
        std::vector<unsigned char> keep(static_cast<size_t>(d.slots), 0);
        std::vector<int64_t> order;
        std::vector<int32_t> key;
        std::vector<float> sorted;
        cu_new[0] = 0;
        for (int64_t b = 0; b < B; ++b) {
          const int64_t n = cu[b + 1] - cu[b], patches = n - p;  // n <= W (CheckSelectCu)
          const int64_t np = std::max(patches, int64_t{0});
          order.resize(static_cast<size_t>(np));
          key.resize(static_cast<size_t>(np));
          std::iota(order.begin(), order.end(), int64_t{0});
          for (int64_t i = 0; i < np; ++i) key[i] = OrderKey(scores[cu[b] + p + i]);
          std::stable_sort(order.begin(), order.end(), [&](int64_t x, int64_t y) { return key[x] > key[y]; });
          sorted.resize(static_cast<size_t>(np));
          for (int64_t i = 0; i < np; ++i) sorted[i] = scores[cu[b] + p + order[i]];
          const int64_t k = KeptPatches(sorted, patches, a);
          k_out[b] = k;
          unsigned char* kb = keep.data() + b * W;
          for (int64_t j = 0; j < std::min(n, p); ++j) kb[j] = 1;
          for (int64_t r = 0; r < std::min(k, np); ++r) kb[p + order[r]] = 1;
          int64_t count = 0;
          for (int64_t j = 0; j < W; ++j) count += kb[j];
          cu_new[b + 1] = cu_new[b] + count;  // <= B * W: no overflow
        }
        // pass 2: destination of every slot (capacity_order), written when below B * bound
        const int64_t live = cu_new[B];
        int64_t kept_before = 0;
        for (int64_t b = 0; b < B; ++b) {
          const int64_t n = cu[b + 1] - cu[b];
          int64_t local = 0;  // kept slots of image b at or before j
          for (int64_t j = 0; j < W; ++j) {
            const int64_t slot = b * W + j;
            const bool kept = keep[slot] != 0;
            local += kept;
            const int64_t dest = kept ? kept_before : live + slot - kept_before;
            kept_before += kept;
            if (dest >= d.rows) continue;
            src[dest] = j < n ? cu[b] + j : 0;
            seq_id[dest] = b;
            pos[dest] = std::max(local - 1, int64_t{0});
          }
        }
        return nullptr;
      },
      kSelectOpName);
}

}  // namespace raggedvit

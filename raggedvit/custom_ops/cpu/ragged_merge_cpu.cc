// CPU kernel: one task per image (each task writes only its image's output rows, so the merged sums are summed in
// one fixed order and the result does not depend on the thread count). Per image: the metric rows (the k heads +
// bias summed in float32 in head order, / H, then / max(||m||, eps)), the A x B cosines in register blocks of
// kScoreRows x kScoreCols (vectorised over B columns, every column by the same instructions, so equal key rows give
// equal scores), each A row's best B row (the first maximum), a stable descending order of the A rows (std::sort on
// (score, A index): no allocation), then the output rows. A B row's value is (x_B s_B + sum x_a s_a) / (s_B +
// sum s_a) in float32 with the merged rows summed in merge order (most similar first), as merge_rows writes it.
//
// With skip (the block's attention branch, and its bias) the task first forms its image's rows x + (skip + bias), each
// sum in float32 rounded to T (merge.residual_rows: the two ONNX Adds the exporter folded in), in a per-thread buffer.
//
// Scores are ordered as torch orders them: -0 = +0, NaN above everything (torch.max and torch.sort both treat NaN
// as the largest value), so NaN keys merge first instead of breaking the sort.
#include "ragged_merge_cpu.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <mutex>
#include <numeric>
#include <type_traits>
#include <vector>

#include "float_convert.h"

namespace raggedvit {

namespace {

constexpr int64_t kScoreRows = 4;   // A rows per register block of the score loop
constexpr int64_t kScoreCols = 16;  // B columns per register block (two AVX registers)

inline int64_t RoundUp(int64_t v, int64_t k) { return (v + k - 1) / k * k; }

// Monotone int key of a score (larger score -> larger key; -0 and +0 equal; every NaN above +inf).
inline int32_t ScoreKey(float s) {
  if (std::isnan(s)) return std::numeric_limits<int32_t>::max();
  s += 0.0f;  // -0 -> +0
  int32_t bits = 0;
  std::memcpy(&bits, &s, sizeof(bits));
  return bits < 0 ? bits ^ 0x7fffffff : bits;
}

// Eight float lanes (GCC / Clang vector extension: one AVX register in the FMA clone, two SSE registers otherwise).
typedef float Lanes __attribute__((vector_size(32)));

// out[i, j] = sum_e a[i, e] * bt[e, j] for kScoreRows rows of a [kScoreRows, Dh] and all `cols` (a multiple of
// kScoreCols) columns of bt [Dh, cols]: the accumulators of a block stay in registers while e runs (in order), and
// every column goes through the same instructions. Cloned for FMA CPUs (-mfma implies AVX; picked at load time by
// the CPU's features: an "arch=haswell" clone is picked by the CPU model, so never on AMD CPUs).
__attribute__((target_clones("fma", "default"))) void ScoreBlock(const float* __restrict a,
                                                                          const float* __restrict bt, int64_t Dh,
                                                                          int64_t cols, float* __restrict out) {
  static_assert(kScoreCols == 2 * sizeof(Lanes) / sizeof(float), "a block row is two Lanes");
  for (int64_t j0 = 0; j0 < cols; j0 += kScoreCols) {
    Lanes acc[kScoreRows][2] = {};
    for (int64_t e = 0; e < Dh; ++e) {
      Lanes b0, b1;  // unaligned loads
      std::memcpy(&b0, bt + e * cols + j0, sizeof(b0));
      std::memcpy(&b1, bt + e * cols + j0 + 8, sizeof(b1));
      for (int64_t i = 0; i < kScoreRows; ++i) {
        const float av = a[i * Dh + e];
        acc[i][0] += b0 * av;
        acc[i][1] += b1 * av;
      }
    }
    for (int64_t i = 0; i < kScoreRows; ++i) {
      std::memcpy(out + i * cols + j0, &acc[i][0], sizeof(Lanes));
      std::memcpy(out + i * cols + j0 + 8, &acc[i][1], sizeof(Lanes));
    }
  }
}

// m [Dh] <- the metric row of one key row k [H*Dh] (+ bias [H*Dh] when not nullptr): k + bias summed head by head in
// float32 (torch's mean over dim 1: the sum, then / H), then m / max(||m||, eps), ||m||^2 summed in eight lanes.
// Cloned for FMA CPUs like ScoreBlock.
__attribute__((target_clones("fma", "default"))) void MetricRow(const float* __restrict k,
                                                                 const float* __restrict bias, int64_t H, int64_t Dh,
                                                                 float* __restrict m) {
  for (int64_t e = 0; e < Dh; ++e) m[e] = 0.0f;
  for (int64_t h = 0; h < H; ++h) {
    const float* kh = k + h * Dh;
    if (bias != nullptr) {
      const float* bh = bias + h * Dh;
      for (int64_t e = 0; e < Dh; ++e) m[e] += kh[e] + bh[e];
    } else {
      for (int64_t e = 0; e < Dh; ++e) m[e] += kh[e];
    }
  }
  const float heads = static_cast<float>(H);
  for (int64_t e = 0; e < Dh; ++e) m[e] /= heads;
  float lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t e = 0;
  for (; e + 8 <= Dh; e += 8) {
    for (int j = 0; j < 8; ++j) lanes[j] += m[e + j] * m[e + j];
  }
  float squares = 0.0f;
  for (; e < Dh; ++e) squares += m[e] * m[e];
  for (int j = 0; j < 8; ++j) squares += lanes[j];
  const float norm = std::max(std::sqrt(squares), kMergeMetricEps);
  for (e = 0; e < Dh; ++e) m[e] /= norm;
}

// Per-thread buffers, reused across calls (sized for the largest image seen).
struct Scratch {
  std::vector<float> a;       // normalised A rows [rows_a, Dh] (rows past n_A zero)
  std::vector<float> bt;      // normalised B rows, transposed [Dh, cols_b] (columns past n_B zero)
  std::vector<float> metric;  // one metric row [Dh]
  std::vector<float> key;     // one key row as float [H*Dh] (float16, bfloat16)
  std::vector<float> block;   // scores of one block of A rows [kScoreRows, cols_b]
  std::vector<float> score;   // best score of each A row [n_A]
  std::vector<float> acc;     // one merged B row's sum [C]
  std::vector<int64_t> best, order, kept, offsets, merged_into;  // [n_A], [n_A], [n_A - r], [n_B + 1], [r]
  std::vector<int32_t> order_key;                                // [n_A]
  std::vector<unsigned char> merged;                             // [n_A]
};

template <typename T>
struct Job {
  const T *x, *qkv;
  const T* skip;          // [T, C] or nullptr
  const float* skip_bias;  // [C] as float, or nullptr
  const float* k_bias;  // the k part of qkv_bias as float [H*Dh], or nullptr
  const float* size;            // nullptr: every row 1
  T* x_out;
  float *size_out, *key_bias, *score;
  int64_t* src;
  MergeDims d;
  MergeAttrs a;
  // The first exception of a task (e.g. std::bad_alloc of its scratch): tasks run on ORT's thread pool, which must
  // not see it; Compute returns it as a status after ParallelFor.
  std::atomic<bool> failed{false};
  std::mutex error_mutex;
  std::string error;
};

// Fills s.a / s.bt with the normalised metric rows of the image whose qkv rows start at `qkv`.
template <typename T>
void MetricRows(const Job<T>& job, const T* qkv, int64_t rows_a, int64_t cols_b, Scratch& s) {
  const MergeDims& d = job.d;
  const int64_t Dh = d.Dh, HD = d.H * d.Dh, W = 3 * HD;
  s.a.assign(static_cast<size_t>(rows_a * Dh), 0.0f);
  s.bt.assign(static_cast<size_t>(Dh * cols_b), 0.0f);
  s.metric.resize(static_cast<size_t>(Dh));
  float* m = s.metric.data();
  if constexpr (!std::is_same_v<T, float>) s.key.resize(static_cast<size_t>(HD));
  for (int64_t t = job.a.num_prefix; t < d.n; ++t) {
    const T* k = qkv + t * W + HD;
    if constexpr (std::is_same_v<T, float>) {
      MetricRow(k, job.k_bias, d.H, Dh, m);
    } else {  // the key row as float first
      for (int64_t i = 0; i < HD; ++i) s.key[static_cast<size_t>(i)] = ToFloat(k[i]);
      MetricRow(s.key.data(), job.k_bias, d.H, Dh, m);
    }
    if (t % 2 == 0) {  // A: the even positions >= p (a0 = p + p%2 is even), B: the odd ones
      std::memcpy(s.a.data() + (t - d.a0) / 2 * Dh, m, static_cast<size_t>(Dh) * sizeof(float));
    } else {
      float* column = s.bt.data() + (t - d.b0) / 2;
      for (int64_t e = 0; e < Dh; ++e) column[e * cols_b] = m[e];
    }
  }
}

// Each A row's best score and B index (the first maximum; NaN wins as in torch.max), into s.score / s.best.
template <typename T>
void BestMatches(const Job<T>& job, int64_t rows_a, int64_t cols_b, Scratch& s) {
  const MergeDims& d = job.d;
  s.score.resize(static_cast<size_t>(d.n_A));
  s.best.assign(static_cast<size_t>(d.n_A), 0);
  if (d.n_B == 0) {  // no B row (n - p < 2): nothing merges, every score -inf
    std::fill(s.score.begin(), s.score.end(), -std::numeric_limits<float>::infinity());
    return;
  }
  s.block.resize(static_cast<size_t>(kScoreRows * cols_b));
  for (int64_t i0 = 0; i0 < rows_a; i0 += kScoreRows) {
    ScoreBlock(s.a.data() + i0 * d.Dh, s.bt.data(), d.Dh, cols_b, s.block.data());
    for (int64_t i = i0; i < std::min(i0 + kScoreRows, d.n_A); ++i) {
      const float* row = s.block.data() + (i - i0) * cols_b;
      float top = row[0];
      int64_t arg = 0;
      for (int64_t j = 1; j < d.n_B; ++j) {
        const float v = row[j];
        if (v > top || (std::isnan(v) && !std::isnan(top))) {
          top = v;
          arg = j;
        }
      }
      s.score[static_cast<size_t>(i)] = top;
      s.best[static_cast<size_t>(i)] = arg;
    }
  }
}

// The image's n rows that merge, [n, C] from input row in0: x itself, or x + (skip + skip_bias) in a per-thread buffer
// (each sum in float32, rounded to T: merge.residual_rows).
template <typename T>
const T* ImageRows(const Job<T>& job, int64_t in0) {
  const int64_t C = job.d.C;
  const T* x = job.x + in0 * C;
  if (job.skip == nullptr) return x;
  thread_local std::vector<T> rows;
  rows.resize(static_cast<size_t>(job.d.n * C));
  const T* skip = job.skip + in0 * C;
  for (int64_t i = 0; i < job.d.n * C; i += C) {  // row by row: the bias by column
    for (int64_t c = 0; c < C; ++c) {
      T branch = skip[i + c];
      if (job.skip_bias != nullptr) branch = FromFloat<T>(ToFloat(branch) + job.skip_bias[c]);
      rows[static_cast<size_t>(i + c)] = FromFloat<T>(ToFloat(x[i + c]) + ToFloat(branch));
    }
  }
  return rows.data();
}

template <typename T>
void MergeImage(const Job<T>& job, int64_t b) {
  const MergeDims& d = job.d;
  const int64_t n = d.n, m = d.m, C = d.C, p = job.a.num_prefix, nA = d.n_A, nB = d.n_B, r = d.r_eff;
  const int64_t rows_a = RoundUp(nA, kScoreRows), cols_b = RoundUp(nB, kScoreCols);
  thread_local Scratch s;
  const int64_t in0 = b * n, out0 = b * m;  // first input / output row of the image
  const T* x = ImageRows(job, in0);         // x[t * C]: the image's row t
  MetricRows(job, job.qkv + in0 * 3 * d.H * d.Dh, rows_a, cols_b, s);
  BestMatches(job, rows_a, cols_b, s);

  // the stable descending order of the A rows: sort on (score, A index)
  s.order_key.resize(static_cast<size_t>(nA));
  s.order.resize(static_cast<size_t>(nA));
  int32_t* key = s.order_key.data();
  int64_t* order = s.order.data();
  const int64_t* best = s.best.data();
  for (int64_t i = 0; i < nA; ++i) key[i] = ScoreKey(s.score[static_cast<size_t>(i)]);
  std::iota(order, order + nA, int64_t{0});
  std::sort(order, order + nA, [key](int64_t u, int64_t v) { return key[u] != key[v] ? key[u] > key[v] : u < v; });
  // merged: order[0, r); kept: the rest, in position order with a class token, else in that order
  s.merged.assign(static_cast<size_t>(nA), 0);
  unsigned char* merged = s.merged.data();
  for (int64_t k = 0; k < r; ++k) merged[order[k]] = 1;
  s.kept.clear();
  if (job.a.class_token) {
    for (int64_t i = 0; i < nA; ++i) {
      if (!merged[i]) s.kept.push_back(i);
    }
  } else {
    s.kept.assign(order + r, order + nA);
  }
  // the A rows merged into each B row j, in merge order: merged_into[ends[j-1], ends[j]) (ends[-1] = 0)
  s.offsets.assign(static_cast<size_t>(nB + 1), 0);
  s.merged_into.resize(static_cast<size_t>(r));
  int64_t* start = s.offsets.data() + 1;  // start[j]: first slot of B row j; after the fill, its end
  for (int64_t k = 0; k < r; ++k) ++start[best[order[k]]];
  for (int64_t j = 0, sum = 0; j < nB; ++j) {
    const int64_t count = start[j];
    start[j] = sum;
    sum += count;
  }
  for (int64_t k = 0; k < r; ++k) s.merged_into[static_cast<size_t>(start[best[order[k]]]++)] = order[k];
  const int64_t* ends = start;

  auto size_of = [&job, in0](int64_t t) { return job.size != nullptr ? job.size[in0 + t] : 1.0f; };
  auto copy_row = [&](int64_t o, int64_t t) {  // output row o of the image <- input row t, unchanged
    std::memcpy(job.x_out + (out0 + o) * C, x + t * C, static_cast<size_t>(C) * sizeof(T));
    job.size_out[out0 + o] = size_of(t);
    job.src[out0 + o] = in0 + t;
  };
  for (int64_t t = 0; t < p; ++t) copy_row(t, t);
  for (int64_t k = 0; k < nA - r; ++k) copy_row(p + k, d.a0 + 2 * s.kept[static_cast<size_t>(k)]);
  s.acc.resize(static_cast<size_t>(C));
  float* acc = s.acc.data();
  for (int64_t j = 0; j < nB; ++j) {
    const int64_t o = p + nA - r + j, t = d.b0 + 2 * j;
    const int64_t begin = ends[j - 1], end = ends[j];
    float merged_size = 0.0f;
    std::fill(acc, acc + C, 0.0f);
    for (int64_t k = begin; k < end; ++k) {
      const int64_t ta = d.a0 + 2 * s.merged_into[static_cast<size_t>(k)];
      const float sa = size_of(ta);
      const T* xa = x + ta * C;
      for (int64_t c = 0; c < C; ++c) acc[c] += ToFloat(xa[c]) * sa;
      merged_size += sa;
    }
    const float sb = size_of(t), total = sb + merged_size;
    const T* xb = x + t * C;
    T* out = job.x_out + (out0 + o) * C;
    for (int64_t c = 0; c < C; ++c) out[c] = FromFloat<T>((ToFloat(xb[c]) * sb + acc[c]) / total);
    job.size_out[out0 + o] = total;
    job.src[out0 + o] = in0 + t;
  }
  for (int64_t o = 0; o < m; ++o) job.key_bias[out0 + o] = std::log(job.size_out[out0 + o]);
  std::copy(s.score.begin(), s.score.end(), job.score + b * nA);
}

template <typename T>
void RunTask(void* data, size_t index) {
  auto* job = static_cast<Job<T>*>(data);
  if (job->failed.load(std::memory_order_relaxed)) return;
  try {
    MergeImage(*job, static_cast<int64_t>(index));
  } catch (const std::exception& e) {
    std::lock_guard<std::mutex> lock(job->error_mutex);
    if (!job->failed.exchange(true)) job->error = e.what();
  } catch (...) {
    std::lock_guard<std::mutex> lock(job->error_mutex);
    if (!job->failed.exchange(true)) job->error = "unknown C++ exception";
  }
}

// p[0, count) as float in *buffer; returns buffer's data.
template <typename T>
const float* AsFloats(const T* p, int64_t count, std::vector<float>* buffer) {
  buffer->resize(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) (*buffer)[static_cast<size_t>(i)] = ToFloat(p[i]);
  return buffer->data();
}

template <typename T>
OrtStatusPtr Compute(Ort::KernelContext& ctx, const MergeAttrs& attrs, const MergeValues& v, const MergeDims& d) {
  const int64_t rows = d.B * d.m;  // <= T
  Job<T> job;
  job.x = v.x.GetTensorData<T>();
  job.qkv = v.qkv.GetTensorData<T>();
  // the biases as float, converted once per call (thread_local: no allocation once grown)
  thread_local std::vector<float> k_bias, skip_bias;
  job.k_bias = v.info.has_qkv_bias ? AsFloats(v.qkv_bias.GetTensorData<T>() + d.H * d.Dh, d.H * d.Dh, &k_bias)
                                   : nullptr;
  job.size = v.info.has_size ? v.size.GetTensorData<float>() : nullptr;
  job.skip = v.info.has_skip ? v.skip.GetTensorData<T>() : nullptr;
  job.skip_bias = v.info.has_skip_bias ? AsFloats(v.skip_bias.GetTensorData<T>(), d.C, &skip_bias) : nullptr;
  job.x_out = ctx.GetOutput(kMergeXOut, {rows, d.C}).GetTensorMutableData<T>();
  job.size_out = ctx.GetOutput(kMergeSizeOut, {rows}).GetTensorMutableData<float>();
  int64_t* cu_out = ctx.GetOutput(kMergeCuOut, {d.B + 1}).GetTensorMutableData<int64_t>();
  job.src = ctx.GetOutput(kMergeSrc, {rows}).GetTensorMutableData<int64_t>();
  job.key_bias = ctx.GetOutput(kMergeKeyBias, {rows}).GetTensorMutableData<float>();
  job.score = ctx.GetOutput(kMergeScore, {d.B * d.n_A}).GetTensorMutableData<float>();
  job.d = d;
  job.a = attrs;
  for (int64_t b = 0; b <= d.B; ++b) cu_out[b] = b * d.m;
  ctx.ParallelFor(&RunTask<T>, static_cast<size_t>(d.B), 0, &job);
  if (job.failed.load()) {
    return MakeMergeStatus(ORT_FAIL, "CPU kernel failed (x shape " + ShapeString(v.info.x) + "): " + job.error);
  }
  return nullptr;
}

}  // namespace

RaggedMergeCpuKernel::RaggedMergeCpuKernel(const MergeAttrs& attrs, const OrtKernelInfo*) : attrs_(attrs) {}

OrtStatusPtr RaggedMergeCpuKernel::ComputeV2(OrtKernelContext* context) {
  return GuardStatus(
      [&]() -> OrtStatusPtr {
        Ort::KernelContext ctx(context);
        const MergeValues v = ReadMergeInputs(ctx);
        MergeDims d;
        std::string err = CheckMergeInputs(v.info, attrs_, &d);
        if (!err.empty()) return MakeMergeStatus(ORT_INVALID_ARGUMENT, err);
        err = CheckMergeCu(v.cu.GetTensorData<int64_t>(), d);
        if (!err.empty()) return MakeMergeStatus(ORT_INVALID_ARGUMENT, err);
        switch (v.info.x_type) {
          case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT: return Compute<float>(ctx, attrs_, v, d);
          case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16: return Compute<Ort::Float16_t>(ctx, attrs_, v, d);
          default: return Compute<Ort::BFloat16_t>(ctx, attrs_, v, d);  // the third type CheckMergeInputs accepts
        }
      },
      kMergeOpName);
}

}  // namespace raggedvit

// CPU kernel: one task per (sequence, block of query rows), all heads inside the task, so the task that
// owns a sequence's first row is the only writer of that sequence's cls_attn entries.
#include "ragged_attention_cpu.h"
#include "float_convert.h"

#include <algorithm>
#include <atomic>
#include <limits>
#include <mutex>

namespace raggedvit {

namespace {

constexpr int64_t kRowsPerTask = 16;

struct Task {
  int64_t seq_begin, seq_end;  // the sequence's rows [seq_begin, seq_end)
  int64_t row_begin, row_end;  // the query rows of this task
};

template <typename T>
struct Job {
  const T* qkv;
  const T* bias;  // [3*H*D] or nullptr
  T* out;
  float* cls;  // nullptr when the output is absent
  const float* pos = nullptr;  // pos_table [H, pos_size] or nullptr
  int64_t pos_size = 0;
  const float* key_bias = nullptr;  // [T] or nullptr: added to every score of its key
  std::vector<RelCode> codes;  // [T] with pos: each row's relative position code (from token_pos)
  Dims d;
  float scale;
  std::vector<Task> tasks;
  // The first exception of a task (e.g. std::bad_alloc of its scratch): tasks run on ORT's thread pool,
  // which must not see it; Compute returns it as a status after ParallelFor.
  std::atomic<bool> failed{false};
  std::mutex error_mutex;
  std::string error;
};

// y[0:n] += a * x[0:n]; cloned for AVX2+FMA CPUs (picked at load time), the only hot loop of the kernel.
__attribute__((target_clones("arch=haswell", "default"))) void Axpy(float* __restrict y, float a,
                                                                     const float* __restrict x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

// qkv element (+ bias element, summed and rounded in T like an ONNX Add of the two tensors) as float.
template <typename T>
inline float Load(const T* row, const T* bias, int64_t i) {
  return bias == nullptr ? ToFloat(row[i]) : ToFloat(FromFloat<T>(ToFloat(row[i]) + ToFloat(bias[i])));
}

template <typename T>
void RunTask(const Job<T>& job, const Task& task) {
  const int64_t H = job.d.H, D = job.d.D, W = 3 * H * D, L = task.seq_end - task.seq_begin;
  const int64_t R = task.row_end - task.row_begin;
  thread_local std::vector<float> kt, v, q, s, acc;
  kt.resize(static_cast<size_t>(L * D));  // K^T [D, L]: scores vectorise over keys
  v.resize(static_cast<size_t>(L * D));   // V [L, D]
  q.resize(static_cast<size_t>(R * D));   // scaled Q rows of the task [R, D]
  s.resize(static_cast<size_t>(R * L));   // scores, then probabilities [R, L]
  acc.resize(static_cast<size_t>(R * D));
  const bool owns_cls = job.cls != nullptr && task.row_begin == task.seq_begin;
  if (owns_cls) std::fill(job.cls + task.seq_begin, job.cls + task.seq_end, 0.0f);
  const float inv_heads = 1.0f / static_cast<float>(H);

  for (int64_t h = 0; h < H; ++h) {
    for (int64_t j = 0; j < L; ++j) {
      const T* row = job.qkv + (task.seq_begin + j) * W;
      for (int64_t e = 0; e < D; ++e) {
        kt[e * L + j] = Load(row, job.bias, H * D + h * D + e);
        v[j * D + e] = Load(row, job.bias, 2 * H * D + h * D + e);
      }
    }
    for (int64_t r = 0; r < R; ++r) {
      const T* qrow = job.qkv + (task.row_begin + r) * W;
      for (int64_t e = 0; e < D; ++e) q[r * D + e] = Load(qrow, job.bias, h * D + e) * job.scale;
    }
    // S = Q K^T: row e of K^T stays in L1 while all R rows use it
    std::fill(s.begin(), s.end(), 0.0f);
    for (int64_t e = 0; e < D; ++e) {
      for (int64_t r = 0; r < R; ++r) Axpy(s.data() + r * L, q[r * D + e], kt.data() + e * L, L);
    }
    if (job.pos != nullptr) {  // relative position bias, added to the scaled logits before the softmax
      const float* table = job.pos + h * job.pos_size;
      const RelCode* keys = job.codes.data() + task.seq_begin;
      for (int64_t r = 0; r < R; ++r) {
        const RelCode& query = job.codes[static_cast<size_t>(task.row_begin + r)];
        float* p = s.data() + r * L;
        for (int64_t j = 0; j < L; ++j) p[j] += table[RelColumn(query, keys[j], job.pos_size)];
      }
    }
    if (job.key_bias != nullptr) {  // per-key bias (proportional attention), every query row of the task
      const float* kb = job.key_bias + task.seq_begin;
      for (int64_t r = 0; r < R; ++r) {
        float* p = s.data() + r * L;
        for (int64_t j = 0; j < L; ++j) p[j] += kb[j];
      }
    }
    for (int64_t r = 0; r < R; ++r) {  // softmax rows in fp32
      float* p = s.data() + r * L;
      float m = -std::numeric_limits<float>::infinity();
      for (int64_t j = 0; j < L; ++j) m = std::max(m, p[j]);
      float sum = 0.0f;
      for (int64_t j = 0; j < L; ++j) {
        p[j] = std::exp(p[j] - m);
        sum += p[j];
      }
      const float inv = 1.0f / sum;
      for (int64_t j = 0; j < L; ++j) p[j] *= inv;
    }
    // O = P V
    std::fill(acc.begin(), acc.end(), 0.0f);
    for (int64_t j = 0; j < L; ++j) {
      for (int64_t r = 0; r < R; ++r) Axpy(acc.data() + r * D, s[r * L + j], v.data() + j * D, D);
    }
    for (int64_t r = 0; r < R; ++r) {
      T* orow = job.out + (task.row_begin + r) * H * D + h * D;
      for (int64_t e = 0; e < D; ++e) orow[e] = FromFloat<T>(acc[r * D + e]);
    }
    if (owns_cls) {  // row 0 of the task is the sequence's first row
      float* c = job.cls + task.seq_begin;
      for (int64_t j = 0; j < L; ++j) c[j] += s[j] * inv_heads;
    }
  }
}

template <typename T>
void RunTaskFn(void* data, size_t index) {
  auto* job = static_cast<Job<T>*>(data);
  if (job->failed.load(std::memory_order_relaxed)) return;
  try {
    RunTask(*job, job->tasks[index]);
  } catch (const std::exception& e) {
    std::lock_guard<std::mutex> lock(job->error_mutex);
    if (!job->failed.exchange(true)) job->error = e.what();
  } catch (...) {
    std::lock_guard<std::mutex> lock(job->error_mutex);
    if (!job->failed.exchange(true)) job->error = "unknown C++ exception";
  }
}

// Tasks of checked cu_seqlens (0 <= cu[b] <= cu[b+1] <= T), and the scratch of the longest sequence: its
// float counts L*D and kRowsPerTask*L must fit size_t. "" on success, else the error text.
template <typename I>
std::string MakeTasks(const I* cu, const Dims& d, std::vector<Task>* tasks) {
  int64_t max_len = 0;
  for (int64_t b = 0; b < d.B; ++b) {
    const int64_t lo = static_cast<int64_t>(cu[b]), hi = static_cast<int64_t>(cu[b + 1]);
    max_len = std::max(max_len, hi - lo);
  }
  int64_t kv = 0, scores = 0;
  if (!CheckedMul(max_len, d.D, &kv) || !CheckedMul(max_len, kRowsPerTask, &scores) ||
      static_cast<uint64_t>(std::max(kv, scores)) > std::numeric_limits<size_t>::max() / sizeof(float)) {
    return "the longest sequence (" + std::to_string(max_len) + " tokens, head dim " + std::to_string(d.D) +
           ") needs more scratch than size_t can address";
  }
  int64_t max_tasks = 0;  // sum over sequences of ceil(L / kRowsPerTask) <= T / kRowsPerTask + B
  if (!CheckedAdd(d.T / kRowsPerTask, d.B, &max_tasks)) {
    return "T / " + std::to_string(kRowsPerTask) + " + B tasks (T = " + std::to_string(d.T) + ", B = " +
           std::to_string(d.B) + ") overflow int64";
  }
  tasks->reserve(static_cast<size_t>(max_tasks));
  for (int64_t b = 0; b < d.B; ++b) {
    const int64_t lo = static_cast<int64_t>(cu[b]), hi = static_cast<int64_t>(cu[b + 1]);
    for (int64_t r = lo; r < hi; r += kRowsPerTask) tasks->push_back({lo, hi, r, std::min(hi, r + kRowsPerTask)});
  }
  return "";
}

template <typename T, typename I>
OrtStatusPtr Compute(Ort::KernelContext& ctx, const Attrs& attrs, const Dims& d, const std::vector<int64_t>& qkv_shape,
                     const Ort::ConstValue& qkv, const Ort::ConstValue& cu_value) {
  const I* cu = cu_value.GetTensorData<I>();
  std::string err = CheckCuValues(cu, d, attrs, qkv_shape);
  if (!err.empty()) return MakeStatus(ORT_INVALID_ARGUMENT, err);

  Job<T> job;
  job.qkv = qkv.GetTensorData<T>();
  job.bias = nullptr;
  const size_t n_inputs = ctx.GetInputCount();
  if (n_inputs > kBiasInput) {
    Ort::ConstValue bias = ctx.GetInput(kBiasInput);
    if (bias) {
      auto info = bias.GetTensorTypeAndShapeInfo();
      err = CheckBias(info.GetShape(), info.GetElementType(), qkv_shape,
                      qkv.GetTensorTypeAndShapeInfo().GetElementType());
      if (!err.empty()) return MakeStatus(ORT_INVALID_ARGUMENT, err);
      job.bias = bias.GetTensorData<T>();
    }
  }
  const void* table = nullptr;
  const void* tokens = nullptr;
  err = ReadPosInputs(ctx, attrs, qkv_shape, cu_value.GetTensorTypeAndShapeInfo().GetElementType(), &table, &tokens);
  if (!err.empty()) return MakeStatus(ORT_INVALID_ARGUMENT, err);
  err = ReadKeyBias(ctx, qkv_shape, &job.key_bias);
  if (!err.empty()) return MakeStatus(ORT_INVALID_ARGUMENT, err);
  if (table != nullptr) {
    job.pos = static_cast<const float*>(table);
    job.pos_size = attrs.pos_size;
    const I* token_pos = static_cast<const I*>(tokens);
    job.codes.resize(static_cast<size_t>(d.T));
    for (int64_t t = 0; t < d.T; ++t) job.codes[static_cast<size_t>(t)] = MakeRelCode(token_pos[t], attrs);
  }
  job.d = d;
  job.scale = attrs.has_scale ? attrs.scale : 1.0f / std::sqrt(static_cast<float>(d.D));
  auto out = ctx.GetOutput(0, {d.T, d.H * d.D});
  job.out = out.GetTensorMutableData<T>();
  job.cls = nullptr;
  if (ctx.GetOutputCount() > 1) {
    auto cls = ctx.GetOutput(1, {d.T});
    if (cls) job.cls = cls.GetTensorMutableData<float>();
  }
  // rows [cu[B], T) are dead (the capacity layout, DESIGN.md section 4): no task writes them, so zero them here
  const int64_t live = static_cast<int64_t>(cu[d.B]);
  if (live < d.T) {
    int64_t begin = 0, end = 0;  // element offsets of the dead rows in out [T, H*D]; T*H*D < T*W was checked
    if (!CheckedMul(live, d.H * d.D, &begin) || !CheckedMul(d.T, d.H * d.D, &end)) {
      return MakeStatus(ORT_INVALID_ARGUMENT, "out [T, H*D] overflows int64 (qkv shape " + ShapeString(qkv_shape) +
                                                  ")");
    }
    std::fill(job.out + begin, job.out + end, FromFloat<T>(0.0f));
    if (job.cls != nullptr) std::fill(job.cls + live, job.cls + d.T, 0.0f);
  }
  err = MakeTasks(cu, d, &job.tasks);
  if (!err.empty()) return MakeStatus(ORT_INVALID_ARGUMENT, err + " (qkv shape " + ShapeString(qkv_shape) + ")");
  if (!job.tasks.empty()) ctx.ParallelFor(&RunTaskFn<T>, job.tasks.size(), 0, &job);
  if (job.failed.load()) {
    return MakeStatus(ORT_FAIL, "CPU kernel failed (qkv shape " + ShapeString(qkv_shape) + "): " + job.error);
  }
  return nullptr;
}

template <typename T>
OrtStatusPtr DispatchIndex(Ort::KernelContext& ctx, const Attrs& attrs, const Dims& d,
                           const std::vector<int64_t>& qkv_shape, const Ort::ConstValue& qkv,
                           const Ort::ConstValue& cu) {
  const auto cu_type = cu.GetTensorTypeAndShapeInfo().GetElementType();
  if (cu_type == ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32) return Compute<T, int32_t>(ctx, attrs, d, qkv_shape, qkv, cu);
  if (cu_type == ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64) return Compute<T, int64_t>(ctx, attrs, d, qkv_shape, qkv, cu);
  return MakeStatus(ORT_INVALID_ARGUMENT, std::string("input 'cu_seqlens' must be int32 or int64, got ") +
                                              ElementTypeName(cu_type));
}

}  // namespace

RaggedAttentionCpuKernel::RaggedAttentionCpuKernel(const Attrs& attrs, const OrtKernelInfo*) : attrs_(attrs) {}

OrtStatusPtr RaggedAttentionCpuKernel::ComputeV2(OrtKernelContext* context) {
  return GuardStatus([&]() -> OrtStatusPtr {
    Ort::KernelContext ctx(context);
    Ort::ConstValue qkv = ctx.GetInput(0);
    Ort::ConstValue cu = ctx.GetInput(1);
    auto qkv_info = qkv.GetTensorTypeAndShapeInfo();
    const std::vector<int64_t> qkv_shape = qkv_info.GetShape();
    const std::vector<int64_t> cu_shape = cu.GetTensorTypeAndShapeInfo().GetShape();
    Dims d;
    std::string err = CheckShapes(qkv_shape, cu_shape, attrs_.num_heads, &d);
    if (!err.empty()) return MakeStatus(ORT_INVALID_ARGUMENT, err);
    switch (qkv_info.GetElementType()) {
      case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT: return DispatchIndex<float>(ctx, attrs_, d, qkv_shape, qkv, cu);
      case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16:
        return DispatchIndex<Ort::Float16_t>(ctx, attrs_, d, qkv_shape, qkv, cu);
      case ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16:
        return DispatchIndex<Ort::BFloat16_t>(ctx, attrs_, d, qkv_shape, qkv, cu);
      default:
        return MakeStatus(ORT_INVALID_ARGUMENT, std::string("input 'qkv' (shape ") + ShapeString(qkv_shape) +
                                                    ") has element type " + ElementTypeName(qkv_info.GetElementType()) +
                                                    "; supported: float16, float, bfloat16");
    }
  });
}

}  // namespace raggedvit

// Library entry points: RegisterCustomOps (ORT's custom-op library ABI) and raggedvit_ort_info().
// The CPU ops are always registered; the CUDA ops only when libcuda.so.1 loads and a device exists.
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "cpu/bias_gelu_cpu.h"
#include "cpu/gather_layer_norm_cpu.h"
#include "cpu/patch_embed_cpu.h"
#include "cpu/ragged_merge_cpu.h"
#include "cpu/ragged_attention_cpu.h"
#include "cpu/ragged_linear_cpu.h"
#include "cpu/ragged_select_cpu.h"
#include "cuda/bias_gelu_cuda.h"
#include "cuda/gather_layer_norm_cuda.h"
#include "cuda/launcher.h"
#include "cuda/patch_embed_cuda.h"
#include "cuda/ragged_merge_cuda.h"
#include "cuda/ragged_attention_cuda.h"
#include "cuda/ragged_linear_cuda.h"
#include "cuda/ragged_select_cuda.h"

#define RAGGEDVIT_EXPORT extern "C" __attribute__((visibility("default")))

namespace raggedvit {
namespace {

struct OpSet {
  std::vector<std::unique_ptr<OrtCustomOp>> ops;
};

const OpSet& Ops() {
  static OpSet set;
  static std::once_flag once;
  std::call_once(once, [] {
    constexpr ONNXTensorElementDataType kCuTypes[] = {ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32,
                                                      ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64};
    for (auto cu : kCuTypes) {
      for (auto token_pos : kCuTypes) set.ops.push_back(std::make_unique<RaggedAttentionCpuOp>(nullptr, cu, token_pos));
      set.ops.push_back(std::make_unique<RaggedLinearCpuOp>(nullptr, ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED, cu));
      set.ops.push_back(std::make_unique<GatherLayerNormCpuOp>(nullptr, ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED, cu));
    }
    set.ops.push_back(std::make_unique<RaggedSelectCpuOp>(nullptr));
    set.ops.push_back(std::make_unique<RaggedMergeCpuOp>(nullptr, ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED));
    set.ops.push_back(std::make_unique<BiasGeluCpuOp>(nullptr, ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED));
    set.ops.push_back(std::make_unique<PatchEmbedCpuOp>(nullptr, ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED));
    if (cuda::DriverAvailable()) {
      set.ops.push_back(std::make_unique<RaggedSelectCudaOp>(kCudaExecutionProvider));
      // typed: bfloat16 RaggedMerge nodes find no CUDA kernel and run on the CPU EP (fp16 and fp32 cubins only)
      for (auto dtype : {ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT}) {
        set.ops.push_back(std::make_unique<RaggedMergeCudaOp>(kCudaExecutionProvider, dtype));
      }
      for (auto images : {ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16}) {
        set.ops.push_back(std::make_unique<PatchEmbedCudaOp>(kCudaExecutionProvider, images));
      }
      // typed like RaggedLinear: float BiasGelu nodes run on the CPU EP (the exporter emits float16 / bfloat16 only)
      for (auto dtype : {ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16, ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16}) {
        set.ops.push_back(std::make_unique<BiasGeluCudaOp>(kCudaExecutionProvider, dtype));
      }
      for (auto cu : kCuTypes) {
        for (auto token_pos : kCuTypes) {
          set.ops.push_back(std::make_unique<RaggedAttentionCudaOp>(kCudaExecutionProvider, cu, token_pos));
        }
        // typed: float RaggedLinear / GatherLayerNorm nodes find no CUDA kernel and run on the CPU EP (no fp32 cubins)
        for (auto dtype : {ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16, ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16}) {
          set.ops.push_back(std::make_unique<RaggedLinearCudaOp>(kCudaExecutionProvider, dtype, cu));
          set.ops.push_back(std::make_unique<GatherLayerNormCudaOp>(kCudaExecutionProvider, dtype, cu));
        }
      }
    }
  });
  return set;
}

}  // namespace
}  // namespace raggedvit

RAGGEDVIT_EXPORT OrtStatus* ORT_API_CALL RegisterCustomOps(OrtSessionOptions* options, const OrtApiBase* api_base) {
  const OrtApi* api = api_base->GetApi(ORT_API_VERSION);
  if (api == nullptr) {
    const std::string msg = std::string("libraggedvit_ort needs ONNX Runtime API version >= ") +
                            std::to_string(ORT_API_VERSION) + "; this runtime is " + api_base->GetVersionString();
    return api_base->GetApi(1)->CreateStatus(ORT_FAIL, msg.c_str());
  }
  Ort::InitApi(api);
  return raggedvit::GuardStatus([&]() -> OrtStatusPtr {
    static std::mutex mutex;
    static std::list<Ort::CustomOpDomain> domains;  // must outlive every session that uses them
    std::lock_guard<std::mutex> lock(mutex);
    domains.emplace_back(raggedvit::kDomain);
    for (const auto& op : raggedvit::Ops().ops) domains.back().Add(op.get());
    Ort::UnownedSessionOptions(options).Add(domains.back());
    return nullptr;
  });
}

RAGGEDVIT_EXPORT const char* raggedvit_ort_info() {
  static std::string info;
  static std::once_flag once;
  std::call_once(once, [] {
    const bool cuda_ok = raggedvit::cuda::DriverAvailable();
    info = std::string("{\"library\": \"libraggedvit_ort\", \"domain\": \"") + raggedvit::kDomain + "\", \"op\": \"" +
           raggedvit::kOpName + "\", \"ops\": [\"" + raggedvit::kOpName + "\", \"" +
           raggedvit::kLinearOpName + "\", \"" + raggedvit::kSelectOpName + "\", \"" + raggedvit::kGeluOpName + "\", \"" + raggedvit::kNormOpName + "\", \"" + raggedvit::kEmbedOpName + "\", \"" + raggedvit::kMergeOpName + "\"], \"ort_api_version\": " + std::to_string(ORT_API_VERSION) +
           ", \"cuda_op_registered\": " + (cuda_ok ? "true" : "false") + ", \"build\": " +
           raggedvit::cuda::kBuildInfoJson + "}";
  });
  return info.c_str();
}

// gptoss.engine::PagedAttention as ONNX Runtime custom ops: the CPU kernel (paged_attention_cpu.cc) and the CUDA
// one (paged_attention_cuda_op.cc, kernels in paged_attention_cuda.cu), each registered for float, fp16, bf16.
//
// Inputs: qkv [T, (H + 2 Hkv) D] T, key_cache [N, Hkv, D] T, value_cache [N, Hkv, D] T, positions [T] int32,
// token_rows [T] int32, page_table [B, P] int32, cos_cache [S, D/2] T, sin_cache [S, D/2] T, sinks [H] T.
// Attributes: num_heads, kv_num_heads, page_size, window (0: none), scale.
// Outputs: out [T, H D] T, present_key and present_value (key_cache's and value_cache's shape: bind them to the
// same memory as the inputs and the caches are updated in place).
#pragma once

#include <onnxruntime_cxx_api.h>

#include "attention_splits.h"
#include "paged_attention_launch.h"

namespace gptoss {

struct AttentionAttributes {
  explicit AttentionAttributes(const OrtKernelInfo* info);
  int64_t heads, kv_heads, page_size, window;
  float scale;
  bool tensor_cores;  // GATEWAY_ATTENTION_MMA (read when the kernel is made): "0" keeps prefills on CUDA cores
  AttentionSplits splits;  // GATEWAY_ATTENTION_SPLITS (attention_splits.h): decode's key split by rows, else none
};

// The inputs as pointers and sizes (shapes and types checked), with the outputs allocated.
AttentionArgs ReadAttentionArgs(Ort::KernelContext& context, const AttentionAttributes& attributes);

struct AttentionKernel {
  AttentionKernel(const OrtApi& /*api*/, const OrtKernelInfo* info) : attributes_(info) {}
  void Compute(OrtKernelContext* context);

 private:
  AttentionAttributes attributes_;
};

struct AttentionCudaKernel {
  AttentionCudaKernel(const OrtApi& /*api*/, const OrtKernelInfo* info) : attributes_(info) {}
  void Compute(OrtKernelContext* context);

 private:
  AttentionAttributes attributes_;
};

template <typename Kernel>
struct AttentionOpBase : Ort::CustomOpBase<AttentionOpBase<Kernel>, Kernel> {
  AttentionOpBase(const char* provider, ONNXTensorElementDataType activation)
      : provider_(provider), activation_(activation) {}
  void* CreateKernel(const OrtApi& api, const OrtKernelInfo* info) const { return new Kernel(api, info); }
  const char* GetName() const { return "PagedAttention"; }
  const char* GetExecutionProviderType() const { return provider_; }
  size_t GetInputTypeCount() const { return 9; }
  ONNXTensorElementDataType GetInputType(size_t index) const {
    return index >= 3 && index <= 5 ? ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32 : activation_;
  }
  size_t GetOutputTypeCount() const { return 3; }
  ONNXTensorElementDataType GetOutputType(size_t /*index*/) const { return activation_; }

 private:
  const char* provider_;
  ONNXTensorElementDataType activation_;
};

}  // namespace gptoss
